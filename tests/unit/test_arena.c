/*
 * tests/unit/test_arena.c — the shared-memory arena across real processes: create and attach from
 * a fork()ed child, every name/region/header error, stale-arena detection by the creator's pid,
 * a zombie creator counts as dead, the futex barrier (no early release over thousands of rounds,
 * timeout when a peer is killed, re-init; the wait without a fixed timeout that outlasts a slow
 * peer, gives up when asked and is released by a break from outside), and the seqlocked draft
 * ring under a concurrent writer and reader.
 *
 * Children never call cmocka: they report through their exit status (and shared counters), and
 * leave with _exit so that nothing of the parent's test state runs twice. Every test registers
 * its shm names and child pids in a fixture whose teardown (which cmocka runs even after a
 * failed assertion) kills leftover children and unlinks the names. Timings are printed, not
 * asserted, except for the generous bounds around the barrier timeout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm/arena.h"

#define TA_MAX_NAMES 4
#define TA_MAX_KIDS 4
#define TA_MAX_ARENAS 4

typedef struct {
    char names[TA_MAX_NAMES][256];
    int n_names;
    pid_t kids[TA_MAX_KIDS];
    arena *a[TA_MAX_ARENAS];
} ta_fixture;

static int ta_setup(void **state)
{
    ta_fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    *state = f;
    return 0;
}

static int ta_teardown(void **state)
{
    ta_fixture *f = *state;
    for (int i = 0; i < TA_MAX_KIDS; i++)
        if (f->kids[i] > 0) {
            kill(f->kids[i], SIGKILL);
            waitpid(f->kids[i], NULL, 0);
        }
    for (int i = 0; i < TA_MAX_ARENAS; i++)
        arena_destroy(&f->a[i]);
    for (int i = 0; i < f->n_names; i++)
        shm_unlink(f->names[i]); /* usually ENOENT by now */
    free(f);
    return 0;
}

/* A name unique to this run and test, unlinked by the teardown. */
static const char *ta_name(ta_fixture *f, const char *tag)
{
    assert_true(f->n_names < TA_MAX_NAMES);
    char *n = f->names[f->n_names++];
    snprintf(n, sizeof f->names[0], "/orochi-test-%d-%s", (int)getpid(), tag);
    shm_unlink(n); /* a previous run with a recycled pid */
    return n;
}

/* fork(); the parent records the child for the teardown. Returns 0 in the child. */
static pid_t ta_fork(ta_fixture *f)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0) {
        int i = 0;
        while (i < TA_MAX_KIDS && f->kids[i] > 0)
            i++;
        assert_true(i < TA_MAX_KIDS);
        f->kids[i] = pid;
    }
    return pid;
}

/* Wait for a child: its exit code, or 128 + signal. */
static int ta_reap(ta_fixture *f, pid_t pid)
{
    int status = 0;
    pid_t r;
    do
        r = waitpid(pid, &status, 0);
    while (r < 0 && errno == EINTR);
    for (int i = 0; i < TA_MAX_KIDS; i++)
        if (f->kids[i] == pid)
            f->kids[i] = 0;
    assert_int_equal(r, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static bool ta_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

static double ta_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define ta_expect_err(err, needle)                                                                                \
    do {                                                                                                          \
        if (!strstr((err), (needle)))                                                                             \
            fail_msg("error '%s' does not mention '%s'", (err), (needle));                                       \
    } while (0)

static const arena_spec SPECS[] = {{"tokens", 1000}, {"kv", 3 * 4096 + 5}, {"tiny", 1}, {"step", 64}};
#define N_SPECS ((int)(sizeof SPECS / sizeof SPECS[0]))

static uint8_t ta_pattern(int region, uint64_t i)
{
    return (uint8_t)(i * 7 + (uint64_t)region * 31 + 1);
}

/* ===== create, attach from a child, destroy ===== */

/* Child side: attach, check the layout against the parent's, write the pattern. */
static int ta_child_attach_and_write(const char *name, const uint64_t *offsets)
{
    char err[256];
    arena *c = arena_attach(name, err, sizeof err);
    if (!c) {
        fprintf(stderr, "child attach: %s\n", err);
        return 10;
    }
    int rc = 0;
    for (int r = 0; r < N_SPECS && rc == 0; r++) {
        uint64_t size = 0;
        uint8_t *p = arena_region_find(c, SPECS[r].name, &size);
        if (!p || size != SPECS[r].size || (uint64_t)(p - (uint8_t *)arena_base(c)) != offsets[r])
            rc = 11;
        for (uint64_t i = 0; rc == 0 && i < size; i++)
            if (p[i] != 0)
                rc = 12;
        for (uint64_t i = 0; rc == 0 && i < size; i++)
            p[i] = ta_pattern(r, i);
    }
    if (rc == 0 && arena_region_find(c, "missing", NULL))
        rc = 13;
    if (rc == 0 && arena_header_of(c)->creator_pid != (uint64_t)getppid())
        rc = 14;
    arena_bump_generation(c);
    arena_destroy(&c); /* an attacher: must not unlink */
    return rc;
}

static void test_create_attach_fork(void **state)
{
    ta_fixture *f = *state;
    const char *name = ta_name(f, "basic");
    char err[256] = "";
    f->a[0] = arena_create(name, SPECS, N_SPECS, false, err, sizeof err);
    if (!f->a[0])
        fail_msg("create: %s", err);
    arena *a = f->a[0];

    const arena_header *h = arena_header_of(a);
    assert_true(h->magic == ARENA_MAGIC);
    assert_int_equal(h->layout_version, ARENA_LAYOUT_VERSION);
    assert_int_equal(h->n_regions, N_SPECS);
    assert_true(h->total_size == arena_size(a));
    assert_true(h->creator_pid == (uint64_t)getpid());
    assert_true(arena_generation(a) == 1);
    assert_string_equal(arena_name(a), name);
    assert_true(arena_size(a) % 64 == 0);

    uint64_t offsets[N_SPECS];
    for (int r = 0; r < N_SPECS; r++) {
        uint64_t size = 0;
        uint8_t *p = arena_region_find(a, SPECS[r].name, &size);
        assert_non_null(p);
        assert_true(size == SPECS[r].size);
        offsets[r] = (uint64_t)(p - (uint8_t *)arena_base(a));
        assert_true(offsets[r] % 64 == 0);
        assert_true(offsets[r] >= sizeof(arena_header));
        assert_true(offsets[r] + size <= arena_size(a));
        if (r > 0)
            assert_true(offsets[r] >= offsets[r - 1] + SPECS[r - 1].size);
        for (uint64_t i = 0; i < size; i++)
            assert_int_equal(p[i], 0);
    }
    assert_null(arena_region_find(a, "nope", NULL));

    /* the object itself: owner read/write only, sized exactly */
    int fd = shm_open(name, O_RDONLY, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    close(fd);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_true((uint64_t)st.st_size == arena_size(a));

    pid_t pid = ta_fork(f);
    if (pid == 0)
        _exit(ta_child_attach_and_write(name, offsets));
    assert_int_equal(ta_reap(f, pid), 0);

    for (int r = 0; r < N_SPECS; r++) {
        uint8_t *p = arena_region_find(a, SPECS[r].name, NULL);
        for (uint64_t i = 0; i < SPECS[r].size; i++)
            if (p[i] != ta_pattern(r, i))
                fail_msg("region %s byte %llu: %u, child wrote %u", SPECS[r].name, (unsigned long long)i, p[i],
                         ta_pattern(r, i));
    }
    assert_true(arena_generation(a) == 2);
    arena_bump_generation(a);
    assert_true(arena_generation(a) == 3);

    /* the child's destroy left the object; the creator's removes it */
    assert_true(ta_exists(name));
    arena_destroy(&f->a[0]);
    assert_null(f->a[0]);
    assert_false(ta_exists(name));
    arena_destroy(&f->a[0]); /* a nulled handle is fine */
}

/* ===== names and regions ===== */

static void ta_expect_create_fails(const char *name, const arena_spec *specs, int n, const char *needle)
{
    char err[256] = "";
    arena *a = arena_create(name, specs, n, false, err, sizeof err);
    if (a) {
        arena_destroy(&a);
        fail_msg("create of '%s' with %d regions succeeded, expected an error about '%s'", name ? name : "(null)",
                 n, needle);
    }
    assert_null(strchr(err, '\n'));
    ta_expect_err(err, needle);
}

static void test_name_and_region_errors(void **state)
{
    ta_fixture *f = *state;
    const arena_spec one[] = {{"r", 64}};

    ta_expect_create_fails(NULL, one, 1, "must start with '/'");
    ta_expect_create_fails("noslash", one, 1, "must start with '/'");
    ta_expect_create_fails("", one, 1, "must start with '/'");
    ta_expect_create_fails("/", one, 1, "empty");
    ta_expect_create_fails("/a/b", one, 1, "no '/'");
    char longname[260];
    longname[0] = '/';
    memset(longname + 1, 'x', 200);
    longname[201] = '\0'; /* 201 characters */
    ta_expect_create_fails(longname, one, 1, "longer than 200");

    /* exactly 200 characters is allowed */
    const char *base = ta_name(f, "n200");
    char *n200 = f->names[f->n_names - 1];
    size_t bl = strlen(base);
    memset(n200 + bl, 'y', 200 - bl);
    n200[200] = '\0';
    char err[256] = "";
    f->a[0] = arena_create(n200, one, 1, false, err, sizeof err);
    if (!f->a[0])
        fail_msg("200-character name: %s", err);
    arena_destroy(&f->a[0]);

    const char *name = ta_name(f, "regions");
    arena_spec many[ARENA_MAX_REGIONS + 1];
    char names[ARENA_MAX_REGIONS + 1][8];
    for (int i = 0; i <= ARENA_MAX_REGIONS; i++) {
        snprintf(names[i], sizeof names[i], "r%d", i);
        many[i] = (arena_spec){names[i], 64};
    }
    ta_expect_create_fails(name, many, ARENA_MAX_REGIONS + 1, "0..32");
    ta_expect_create_fails(name, many, -1, "0..32");
    ta_expect_create_fails(name, NULL, 2, "no region specs");
    ta_expect_create_fails(name, (arena_spec[]){{"a", 8}, {NULL, 8}}, 2, "region 1 has no name");
    ta_expect_create_fails(name, (arena_spec[]){{"", 8}}, 1, "region 0 has no name");
    ta_expect_create_fails(name, (arena_spec[]){{"abcdefghijklmnopqrstuvwxyz012345", 8}}, 1, "too long");
    ta_expect_create_fails(name, (arena_spec[]){{"kv", 8}, {"x", 8}, {"kv", 16}}, 3, "'kv' is used twice");
    ta_expect_create_fails(name, (arena_spec[]){{"empty", 0}}, 1, "'empty' has size 0");
    ta_expect_create_fails(name, (arena_spec[]){{"huge", UINT64_MAX}}, 1, "too large");
    ta_expect_create_fails(name, (arena_spec[]){{"a", UINT64_MAX / 2}, {"b", UINT64_MAX / 2}}, 2, "too large");
    assert_false(ta_exists(name)); /* nothing was created by a failed layout */

    /* the limits themselves are fine: 32 regions, a 31-character name */
    many[0].name = "abcdefghijklmnopqrstuvwxyz01234";
    f->a[0] = arena_create(name, many, ARENA_MAX_REGIONS, false, err, sizeof err);
    if (!f->a[0])
        fail_msg("32 regions: %s", err);
    assert_non_null(arena_region_find(f->a[0], "abcdefghijklmnopqrstuvwxyz01234", NULL));
    assert_non_null(arena_region_find(f->a[0], "r31", NULL));

    /* taken name without replace_stale; attach errors */
    ta_expect_create_fails(name, one, 1, "already exists");
    arena *b = arena_attach("/orochi-test-no-such-arena-here", err, sizeof err);
    assert_null(b);
    ta_expect_err(err, "does not exist");
    assert_null(arena_attach("relative", err, sizeof err));
    ta_expect_err(err, "must start with '/'");
    assert_false(arena_unlink_stale("bad/name"));
    arena_destroy(&f->a[0]);
}

/* ===== attach never trusts the object ===== */

/* Create a raw object of `size` bytes holding `bytes` (n of them) at its start. */
static void ta_make_raw(const char *name, const void *bytes, size_t n, size_t size)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    if (n)
        assert_int_equal(pwrite(fd, bytes, n, 0), (ssize_t)n);
    close(fd);
}

static void ta_expect_attach_fails(const char *name, const char *needle)
{
    char err[256] = "";
    arena *a = arena_attach(name, err, sizeof err);
    if (a) {
        arena_destroy(&a);
        fail_msg("attach succeeded, expected an error about '%s'", needle);
    }
    assert_null(strchr(err, '\n'));
    ta_expect_err(err, needle);
}

static void test_attach_rejects_garbage(void **state)
{
    ta_fixture *f = *state;
    const char *raw = ta_name(f, "garbage");
    char err[256];

    uint8_t junk[4096];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof junk; i++) {
        x = x * 1664525u + 1013904223u;
        junk[i] = (uint8_t)(x >> 24);
    }
    ta_make_raw(raw, junk, sizeof junk, sizeof junk);
    ta_expect_attach_fails(raw, "bad magic");
    /* garbage counts as stale: replace_stale takes the name over */
    f->a[1] = arena_create(raw, SPECS, 1, true, err, sizeof err);
    if (!f->a[1])
        fail_msg("replace garbage: %s", err);
    arena_destroy(&f->a[1]);

    ta_make_raw(raw, junk, 10, 10);
    ta_expect_attach_fails(raw, "truncated");
    assert_true(arena_unlink_stale(raw));
    assert_false(ta_exists(raw));
    ta_make_raw(raw, NULL, 0, 0);
    ta_expect_attach_fails(raw, "truncated");
    assert_true(arena_unlink_stale(raw));

    /* a real arena whose header we corrupt field by field through a second mapping */
    const char *name = ta_name(f, "corrupt");
    f->a[0] = arena_create(name, SPECS, N_SPECS, false, err, sizeof err);
    if (!f->a[0])
        fail_msg("create: %s", err);
    uint64_t size = arena_size(f->a[0]);
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    arena_header *h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(h != MAP_FAILED);
    arena_header good;
    memcpy(&good, h, sizeof good);
    arena *ok = arena_attach(name, err, sizeof err);
    if (!ok)
        fail_msg("attach to the intact arena: %s", err);
    arena_destroy(&ok);

#define TA_CORRUPT(stmt, needle)                                                                                  \
    do {                                                                                                          \
        memcpy(h, &good, sizeof good);                                                                            \
        stmt;                                                                                                     \
        ta_expect_attach_fails(name, needle);                                                                     \
    } while (0)
    TA_CORRUPT(h->magic ^= 1, "bad magic");
    TA_CORRUPT(h->layout_version = 99, "layout_version 99");
    TA_CORRUPT(h->total_size += 64, "total_size");
    TA_CORRUPT(h->total_size = 0, "total_size");
    TA_CORRUPT(h->n_regions = ARENA_MAX_REGIONS + 1, "n_regions");
    TA_CORRUPT(h->n_regions = UINT32_MAX, "n_regions");
    TA_CORRUPT(memset(h->regions[2].name, 'A', ARENA_NAME_LEN), "not NUL-terminated");
    TA_CORRUPT(h->regions[1].name[0] = '\0', "empty name");
    TA_CORRUPT(h->regions[0].offset += 8, "not 64-byte aligned");
    TA_CORRUPT(h->regions[0].offset = 0, "overlaps the header");
    TA_CORRUPT(h->regions[3].offset = size, "outside");
    TA_CORRUPT(h->regions[3].size = 65, "outside");
    TA_CORRUPT(h->regions[1].size = UINT64_MAX, "outside");
    TA_CORRUPT(h->regions[2].offset = UINT64_MAX - 63, "outside");
    TA_CORRUPT(strcpy(h->regions[3].name, "kv"), "appears twice");
    TA_CORRUPT(h->regions[1].offset = h->regions[0].offset, "overlap");
#undef TA_CORRUPT
    memcpy(h, &good, sizeof good);

    /* the object grew behind the header's back */
    assert_int_equal(ftruncate(fd, (off_t)size + 4096), 0);
    ta_expect_attach_fails(name, "total_size");
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    ok = arena_attach(name, err, sizeof err);
    if (!ok)
        fail_msg("attach after restoring the header: %s", err);
    arena_destroy(&ok);
    munmap(h, sizeof *h);
    close(fd);
}

/* ===== stale arenas: the creator's pid decides ===== */

static int ta_child_create_and_vanish(const char *name)
{
    char err[256];
    arena *a = arena_create(name, SPECS, N_SPECS, false, err, sizeof err);
    if (!a) {
        fprintf(stderr, "child create: %s\n", err);
        return 1;
    }
    return 0; /* _exit without arena_destroy: the object stays, its creator is gone */
}

static void test_stale_detection(void **state)
{
    ta_fixture *f = *state;
    const char *name = ta_name(f, "stale");
    char err[256] = "";

    pid_t pid = ta_fork(f);
    if (pid == 0)
        _exit(ta_child_create_and_vanish(name));
    assert_int_equal(ta_reap(f, pid), 0); /* reaped: a zombie would still answer kill(pid, 0) */
    assert_true(ta_exists(name));

    ta_expect_create_fails(name, SPECS, 1, "already exists");
    f->a[0] = arena_create(name, SPECS, 2, true, err, sizeof err);
    if (!f->a[0])
        fail_msg("replace a dead creator's arena: %s", err);
    assert_true(arena_header_of(f->a[0])->creator_pid == (uint64_t)getpid());
    assert_int_equal(arena_header_of(f->a[0])->n_regions, 2);

    /* now the creator (this process) is alive */
    arena *again = arena_create(name, SPECS, 1, true, err, sizeof err);
    if (again) {
        arena_destroy(&again);
        fail_msg("replaced an arena whose creator is alive");
    }
    char want[300];
    snprintf(want, sizeof want, "arena %s is in use by pid %d", name, (int)getpid());
    assert_string_equal(err, want);
    assert_false(arena_unlink_stale(name));
    assert_true(ta_exists(name));
    arena_destroy(&f->a[0]);
    assert_false(ta_exists(name));

    /* arena_unlink_stale removes a dead creator's arena, once */
    pid = ta_fork(f);
    if (pid == 0)
        _exit(ta_child_create_and_vanish(name));
    assert_int_equal(ta_reap(f, pid), 0);
    assert_true(ta_exists(name));
    assert_true(arena_unlink_stale(name));
    assert_false(ta_exists(name));
    assert_false(arena_unlink_stale(name));
}

/* A creator that died but was not reaped yet (a zombie, as under an init that does not reap)
 * still answers kill(pid, 0): its arena is stale all the same. */
static void test_stale_zombie_creator(void **state)
{
    ta_fixture *f = *state;
    const char *name = ta_name(f, "zombie");
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = ta_fork(f);
    if (pid == 0) {
        int rc = ta_child_create_and_vanish(name);
        char c = (char)rc;
        if (write(pipefd[1], &c, 1) != 1)
            rc = 3;
        _exit(rc);
    }
    char c = 9;
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    assert_int_equal(c, 0);
    close(pipefd[0]);
    close(pipefd[1]);
    /* wait until it is a zombie, without reaping it */
    siginfo_t si;
    memset(&si, 0, sizeof si);
    assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
    assert_int_equal(kill(pid, 0), 0); /* still there for kill() */
    assert_true(ta_exists(name));
    assert_true(arena_unlink_stale(name));
    assert_false(ta_exists(name));
    assert_int_equal(ta_reap(f, pid), 0);
}

/* ===== barrier ===== */

typedef struct {
    arena_barrier bar;
    uint64_t counter;   /* +1 per party per round */
    uint64_t ns[4];     /* per party: time for the timed rounds */
    uint32_t bad_round; /* first round where a party saw an early release, + 1 */
} ta_sync;

/* Each round: count, wait, then the count must include every party's increment for this round
 * and at most one increment per other party for the next one. */
static int ta_barrier_party(ta_sync *s, int me, uint32_t parties, int rounds, int spin)
{
    struct timespec t0 = {0}, t1;
    for (int r = 0; r < rounds; r++) {
        if (r == 1)
            clock_gettime(CLOCK_MONOTONIC, &t0); /* round 0 absorbs the staggered fork */
        __atomic_fetch_add(&s->counter, 1, __ATOMIC_RELAXED);
        if (arena_barrier_wait(&s->bar, 5000, spin) != 0)
            return 2;
        uint64_t c = __atomic_load_n(&s->counter, __ATOMIC_RELAXED);
        uint64_t lo = (uint64_t)parties * (uint64_t)(r + 1);
        if (c < lo || c > lo + parties - 1) {
            uint32_t zero = 0;
            __atomic_compare_exchange_n(&s->bad_round, &zero, (uint32_t)r + 1, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
            return 3;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s->ns[me] = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
    return 0;
}

static arena *ta_sync_arena(ta_fixture *f, const char *tag, ta_sync **s)
{
    char err[256] = "";
    const arena_spec spec[] = {{"sync", sizeof(ta_sync)}};
    arena *a = arena_create(ta_name(f, tag), spec, 1, false, err, sizeof err);
    if (!a)
        fail_msg("create: %s", err);
    *s = arena_region_find(a, "sync", NULL);
    assert_non_null(*s);
    return a;
}

/* `parties` children run the counting protocol; returns the slowest party's time per round. */
static double ta_barrier_run(ta_fixture *f, ta_sync *s, uint32_t parties, int rounds, int spin)
{
    memset(s, 0, sizeof *s);
    arena_barrier_init(&s->bar, parties);
    pid_t pids[4];
    for (uint32_t p = 0; p < parties; p++) {
        pids[p] = ta_fork(f);
        if (pids[p] == 0)
            _exit(ta_barrier_party(s, (int)p, parties, rounds, spin));
    }
    int bad = 0;
    for (uint32_t p = 0; p < parties; p++)
        bad |= ta_reap(f, pids[p]);
    if (bad)
        fail_msg("barrier, %u parties: a party failed (exit bits %d), first early release at round %u", parties,
                 bad, s->bad_round ? s->bad_round - 1 : 0);
    assert_int_equal(s->bad_round, 0);
    assert_true(s->counter == (uint64_t)parties * (uint64_t)rounds);
    uint64_t worst = 0;
    for (uint32_t p = 0; p < parties; p++)
        worst = s->ns[p] > worst ? s->ns[p] : worst;
    return worst / 1e3 / (rounds - 1);
}

static void test_barrier_rounds(void **state)
{
    ta_fixture *f = *state;
    ta_sync *s;
    f->a[0] = ta_sync_arena(f, "barrier", &s);

    double us3 = ta_barrier_run(f, s, 3, 2000, 20000);
    printf("barrier: 3 processes, 2000 rounds, spin 20000: %.2f us/round\n", us3);
    double us2 = ta_barrier_run(f, s, 2, 20000, 20000);
    printf("barrier: 2 processes, 20000 rounds, spin 20000: %.2f us/round\n", us2);
    double us2f = ta_barrier_run(f, s, 2, 2000, 0);
    printf("barrier: 2 processes, 2000 rounds, futex only (spin 0): %.2f us/round\n", us2f);

    /* misuse: an unconfigured barrier never blocks */
    arena_barrier unconfigured = {0};
    assert_int_equal(arena_barrier_wait(&unconfigured, 1000, 10), -1);
}

static int ta_child_rounds_then_hang(ta_sync *s, int rounds)
{
    for (int r = 0; r < rounds; r++)
        if (arena_barrier_wait(&s->bar, 5000, 1000) != 0)
            return 2;
    for (;;)
        pause(); /* alive but never arriving again, until killed */
}

static void test_barrier_timeout(void **state)
{
    ta_fixture *f = *state;
    ta_sync *s;
    f->a[0] = ta_sync_arena(f, "timeout", &s);
    arena_barrier_init(&s->bar, 2);

    pid_t pid = ta_fork(f);
    if (pid == 0)
        _exit(ta_child_rounds_then_hang(s, 50));
    for (int r = 0; r < 50; r++)
        assert_int_equal(arena_barrier_wait(&s->bar, 5000, 1000), 0);
    kill(pid, SIGKILL);
    assert_int_equal(ta_reap(f, pid), 128 + SIGKILL);

    const int timeout_ms = 200;
    double t0 = ta_now_ms();
    int rc = arena_barrier_wait(&s->bar, timeout_ms, 1000);
    double waited = ta_now_ms() - t0;
    printf("barrier: peer killed, survivor's wait returned %d after %.1f ms (timeout %d ms)\n", rc, waited,
           timeout_ms);
    assert_int_equal(rc, -1);
    assert_true(waited >= timeout_ms - 1);
    assert_true(waited < timeout_ms + 2000);
    assert_int_equal(__atomic_load_n(&s->bar.broken, __ATOMIC_ACQUIRE), 1);

    t0 = ta_now_ms();
    for (int i = 0; i < 100; i++)
        assert_int_equal(arena_barrier_wait(&s->bar, timeout_ms, 1000), -1);
    double later = ta_now_ms() - t0;
    printf("barrier: 100 waits on the broken barrier took %.3f ms in all\n", later);
    /* none of them waited (that would take 100 x 200 ms); the bound is one timeout, not a tighter
     * figure, because a loaded machine can preempt this loop for tens of milliseconds */
    assert_true(later < timeout_ms);

    /* re-init: a fresh peer and the survivor complete rounds again */
    arena_barrier_init(&s->bar, 2);
    pid = ta_fork(f);
    if (pid == 0) {
        for (int r = 0; r < 20; r++)
            if (arena_barrier_wait(&s->bar, 5000, 1000) != 0)
                _exit(2);
        _exit(0);
    }
    for (int r = 0; r < 20; r++)
        assert_int_equal(arena_barrier_wait(&s->bar, 5000, 1000), 0);
    assert_int_equal(ta_reap(f, pid), 0);
    assert_int_equal(s->bar.broken, 0);
}

/* A waiter with a long timeout is woken when another waiter's short timeout breaks the barrier. */
static void test_barrier_break_wakes_sleepers(void **state)
{
    ta_fixture *f = *state;
    ta_sync *s;
    f->a[0] = ta_sync_arena(f, "wake", &s);
    arena_barrier_init(&s->bar, 3); /* the third party never comes */

    pid_t pid = ta_fork(f);
    if (pid == 0) {
        usleep(20000); /* let the parent fall asleep first */
        _exit(arena_barrier_wait(&s->bar, 100, 1000) == -1 ? 0 : 2);
    }
    double t0 = ta_now_ms();
    int rc = arena_barrier_wait(&s->bar, 10000, 1000);
    double waited = ta_now_ms() - t0;
    printf("barrier: sleeper with a 10 s timeout woken by a peer's 100 ms timeout after %.1f ms\n", waited);
    assert_int_equal(rc, -1);
    assert_true(waited < 3000);
    assert_int_equal(ta_reap(f, pid), 0);
}

static bool ta_count_slices(void *arg)
{
    int *n = arg;
    (*n)++;
    return true;
}

static bool ta_give_up_after_5(void *arg)
{
    int *n = arg;
    return ++*n < 5;
}

/* arena_barrier_wait_while: a party that is slower than any fixed timeout would allow does not
 * break the round; the waiter is asked after every slice; it gives up when told to; and a break
 * from outside (the coordinator's, when a party dies) releases it at once. */
static void test_barrier_wait_while(void **state)
{
    ta_fixture *f = *state;
    ta_sync *s;
    f->a[0] = ta_sync_arena(f, "while", &s);

    /* a slow peer: arrives after 600 ms, the waiter's slices are 50 ms */
    arena_barrier_init(&s->bar, 2);
    pid_t pid = ta_fork(f);
    if (pid == 0) {
        usleep(600000);
        _exit(arena_barrier_wait(&s->bar, 5000, 1000) == 0 ? 0 : 2);
    }
    int slices = 0;
    double t0 = ta_now_ms();
    int rc = arena_barrier_wait_while(&s->bar, 1000, 50, ta_count_slices, &slices);
    double waited = ta_now_ms() - t0;
    printf("barrier: wait_while outlasted a 600 ms peer in %.1f ms, asked %d times\n", waited,
           slices);
    assert_int_equal(rc, 0);
    assert_true(waited >= 500);
    assert_true(slices >= 5);
    assert_int_equal(ta_reap(f, pid), 0);
    assert_int_equal(__atomic_load_n(&s->bar.broken, __ATOMIC_ACQUIRE), 0);

    /* nobody comes, and the waiter is told to stop after 5 slices: the round is abandoned */
    arena_barrier_init(&s->bar, 2);
    int asked = 0;
    t0 = ta_now_ms();
    rc = arena_barrier_wait_while(&s->bar, 1000, 20, ta_give_up_after_5, &asked);
    waited = ta_now_ms() - t0;
    printf("barrier: wait_while gave up after %d slices, %.1f ms\n", asked, waited);
    assert_int_equal(rc, -1);
    assert_int_equal(asked, 5);
    assert_true(waited < 3000);
    assert_int_equal(__atomic_load_n(&s->bar.broken, __ATOMIC_ACQUIRE), 1);

    /* a break from another process releases a waiter that would wait for ever */
    arena_barrier_init(&s->bar, 3);
    pid = ta_fork(f);
    if (pid == 0) {
        usleep(200000);
        arena_barrier_break(&s->bar);
        _exit(0);
    }
    slices = 0;
    t0 = ta_now_ms();
    rc = arena_barrier_wait_while(&s->bar, 1000, 5000, ta_count_slices, &slices);
    waited = ta_now_ms() - t0;
    printf("barrier: wait_while released by a break after %.1f ms\n", waited);
    assert_int_equal(rc, -1);
    assert_true(waited < 3000);
    assert_int_equal(ta_reap(f, pid), 0);
}

/* ===== draft ring ===== */

#define TA_RING_SLOTS 8
#define TA_DRAFTS 100000

typedef struct {
    uint32_t reader_ready, writer_done;
    uint64_t reads_ok, reads_failed, newest_ok;
    char msg[160];
} ta_ring_ctl;

static void ta_fill_draft(arena_draft *d, uint32_t i)
{
    memset(d, 0, sizeof *d);
    d->n = 1 + i % ARENA_DRAFT_MAX;
    d->request_id = i;
    d->ctx_len = 2ull * i;
    d->last_token = -(int32_t)i;
    for (uint32_t k = 0; k < d->n; k++) {
        d->tokens[k] = (int32_t)i;
        d->conf[k] = (float)i;
    }
}

/* Every field of a successfully read draft must come from one and the same put. */
static bool ta_draft_consistent(const arena_draft *d, uint32_t slot, char *msg, size_t len)
{
    uint64_t id = d->request_id;
    if (id == 0 || id > TA_DRAFTS || (id - 1) % TA_RING_SLOTS != slot) {
        snprintf(msg, len, "slot %u holds request_id %llu", slot, (unsigned long long)id);
        return false;
    }
    if (d->n != 1 + id % ARENA_DRAFT_MAX || d->ctx_len != 2 * id || d->last_token != -(int32_t)id ||
        (d->seq & 1) || d->seq == 0) {
        snprintf(msg, len, "draft %llu: n %u ctx_len %llu last_token %d seq %u", (unsigned long long)id, d->n,
                 (unsigned long long)d->ctx_len, d->last_token, d->seq);
        return false;
    }
    for (uint32_t k = 0; k < ARENA_DRAFT_MAX; k++) {
        int32_t want_t = k < d->n ? (int32_t)id : 0;
        float want_c = k < d->n ? (float)id : 0.0f;
        if (d->tokens[k] != want_t || d->conf[k] != want_c) {
            snprintf(msg, len, "draft %llu (n %u): token %u is %d, conf %g", (unsigned long long)id, d->n, k,
                     d->tokens[k], (double)d->conf[k]);
            return false;
        }
    }
    return true;
}

static int ta_ring_writer(arena_draft_ring *ring, ta_ring_ctl *ctl)
{
    while (!__atomic_load_n(&ctl->reader_ready, __ATOMIC_ACQUIRE))
        ;
    arena_draft d;
    for (uint32_t i = 1; i <= TA_DRAFTS; i++) {
        ta_fill_draft(&d, i);
        d.seq = 12345; /* ignored by put */
        if (arena_draft_ring_put(ring, &d) != (i - 1) % TA_RING_SLOTS)
            return 2;
    }
    __atomic_store_n(&ctl->writer_done, 1, __ATOMIC_RELEASE);
    return 0;
}

static int ta_ring_reader(const arena_draft_ring *ring, ta_ring_ctl *ctl)
{
    uint64_t last_id[TA_RING_SLOTS] = {0};
    uint32_t x = 2463534242u;
    uint64_t ok = 0, failed = 0, newest = 0;
    arena_draft d;
    __atomic_store_n(&ctl->reader_ready, 1, __ATOMIC_RELEASE);
    /* on until the writer is done and then 1000 reads more: those find every slot finished, so
     * a consistent read is certain even when every read during the writes met one in progress
     * (two processes time-sharing one busy core) */
    uint64_t after = 0;
    for (uint64_t it = 0; after < 1000; it++) {
        if (__atomic_load_n(&ctl->writer_done, __ATOMIC_ACQUIRE))
            after++;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        uint32_t slot = x % TA_RING_SLOTS;
        uint32_t head = 0;
        if (it % 4 == 0) { /* every fourth read: the newest finished draft */
            head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
            if (head == 0)
                continue;
            slot = (head - 1) % TA_RING_SLOTS;
        }
        if (!arena_draft_ring_get(ring, TA_RING_SLOTS, slot, &d)) {
            failed++;
            continue;
        }
        ok++;
        if (!ta_draft_consistent(&d, slot, ctl->msg, sizeof ctl->msg))
            return 3;
        if (d.request_id < last_id[slot]) {
            snprintf(ctl->msg, sizeof ctl->msg, "slot %u went back from draft %llu to %llu", slot,
                     (unsigned long long)last_id[slot], (unsigned long long)d.request_id);
            return 4;
        }
        last_id[slot] = d.request_id;
        if (head) {
            newest++;
            if (d.request_id < head) { /* published before head moved past it, so at least this new */
                snprintf(ctl->msg, sizeof ctl->msg, "head %u but its slot holds older draft %llu", head,
                         (unsigned long long)d.request_id);
                return 5;
            }
        }
    }
    ctl->reads_ok = ok;
    ctl->reads_failed = failed;
    ctl->newest_ok = newest;
    return 0;
}

static void test_draft_ring(void **state)
{
    ta_fixture *f = *state;
    char err[256] = "";
    const arena_spec spec[] = {{"ring", arena_draft_ring_bytes(TA_RING_SLOTS)}, {"ctl", sizeof(ta_ring_ctl)}};
    f->a[0] = arena_create(ta_name(f, "ring"), spec, 2, false, err, sizeof err);
    if (!f->a[0])
        fail_msg("create: %s", err);
    arena_draft_ring *ring = arena_region_find(f->a[0], "ring", NULL);
    ta_ring_ctl *ctl = arena_region_find(f->a[0], "ctl", NULL);
    assert_non_null(ring);
    assert_non_null(ctl);
    assert_true((uintptr_t)ring % 64 == 0);

    arena_draft d;
    arena_draft_ring unconfigured = {0};
    ta_fill_draft(&d, 1);
    assert_int_equal(arena_draft_ring_put(&unconfigured, &d), UINT32_MAX);

    arena_draft_ring_init(ring, TA_RING_SLOTS);
    for (uint32_t i = 0; i < TA_RING_SLOTS; i++)
        assert_false(arena_draft_ring_get(ring, TA_RING_SLOTS, i, &d)); /* never written */
    assert_false(arena_draft_ring_get(ring, TA_RING_SLOTS, TA_RING_SLOTS, &d));
    /* a count in the ring beyond the reader's own layout is not believed */
    ring->n_slots = 1u << 30;
    assert_false(arena_draft_ring_get(ring, TA_RING_SLOTS, TA_RING_SLOTS + 5, &d));
    ring->n_slots = TA_RING_SLOTS;

    /* an oversized n is clamped, not overrun */
    ta_fill_draft(&d, 1);
    d.n = 1000;
    assert_int_equal(arena_draft_ring_put(ring, &d), 0);
    assert_true(arena_draft_ring_get(ring, TA_RING_SLOTS, 0, &d));
    assert_int_equal(d.n, ARENA_DRAFT_MAX);
    arena_draft_ring_init(ring, TA_RING_SLOTS);

    pid_t reader = ta_fork(f);
    if (reader == 0)
        _exit(ta_ring_reader(ring, ctl));
    pid_t writer = ta_fork(f);
    if (writer == 0)
        _exit(ta_ring_writer(ring, ctl));
    int wrc = ta_reap(f, writer), rrc = ta_reap(f, reader);
    if (wrc || rrc)
        fail_msg("draft ring: writer exit %d, reader exit %d: %s", wrc, rrc, ctl->msg);
    printf("draft ring: %d puts into %d slots; reader: %llu consistent reads (%llu of the newest draft), %llu "
           "torn or in-progress reads rejected\n",
           TA_DRAFTS, TA_RING_SLOTS, (unsigned long long)ctl->reads_ok, (unsigned long long)ctl->newest_ok,
           (unsigned long long)ctl->reads_failed);
    assert_true(ctl->reads_ok > 0);

    assert_int_equal(ring->head, TA_DRAFTS);
    for (uint32_t slot = 0; slot < TA_RING_SLOTS; slot++) {
        assert_true(arena_draft_ring_get(ring, TA_RING_SLOTS, slot, &d));
        char msg[160];
        if (!ta_draft_consistent(&d, slot, msg, sizeof msg))
            fail_msg("after the run: %s", msg);
        assert_true(d.request_id > TA_DRAFTS - TA_RING_SLOTS);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_attach_fork, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_name_and_region_errors, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_attach_rejects_garbage, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_stale_detection, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_stale_zombie_creator, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_barrier_rounds, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_barrier_timeout, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_barrier_break_wakes_sleepers, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_barrier_wait_while, ta_setup, ta_teardown),
        cmocka_unit_test_setup_teardown(test_draft_ring, ta_setup, ta_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
