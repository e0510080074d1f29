/*
 * coordinator/coord_trace.c — the step timeline: while `orochi-launch trace` runs, the coordinator
 * writes every step of the group as Chrome trace JSON (open it in Perfetto or chrome://tracing;
 * docs/operations.md, "The step timeline").
 *
 * Nothing is collected from the peers for it: what the timeline shows already travels with the
 * messages the group exchanges anyway. A worker's StepDone carries when its step began and where
 * the time went (the stretches between the forward pass's synchronisation points, by kind, and
 * its barrier waits, the long ones one by one); a speculator's DraftReady carries when the
 * Feedback it answers arrived, when it was applied, and when drafting began and ended. All stamps
 * are CLOCK_MONOTONIC, which every process of the group (one machine) shares. So a trace costs
 * the peers nothing, and the coordinator one formatted line per event (measured in
 * docs/operations.md).
 *
 * One track (pid) per process, named by its role; the coordinator has a thread for its
 * verification loop (cycles, draft waits, steps, verification) and one per sequence slot (the
 * requests it served), plus the queue as async spans. Timestamps are microseconds from the
 * trace's start; spans that began before it are left out. The file is written to OUT.part and
 * renamed to OUT when complete, so a reader never sees half a trace.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/coord.h"

#define TRACE_MAX_PIDS 256 /* processes named in one trace (respawns included) */

struct coord_trace {
    FILE *f;
    char path[4096], part[4200], op[64];
    uint64_t t0_us, until_us;
    uint64_t events;
    int pids[TRACE_MAX_PIDS]; /* processes whose name was written */
    int n_pids;
};

/* a JSON string body: quotes, backslashes and control characters escaped */
static void trace_str(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

static void trace_sep(struct coord_trace *t)
{
    fputs(t->events++ ? ",\n" : "\n", t->f);
}

static void trace_meta(struct coord_trace *t, int pid, int tid, const char *what, const char *name)
{
    trace_sep(t);
    fprintf(t->f, "{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"", what,
            pid, tid);
    trace_str(t->f, name);
    fputs("\"}}", t->f);
}

/* name process `pid` the first time it appears (a respawned role is a new process) */
static void trace_process(struct coord_trace *t, int pid, const char *role)
{
    for (int i = 0; i < t->n_pids; i++)
        if (t->pids[i] == pid)
            return;
    if (t->n_pids < TRACE_MAX_PIDS)
        t->pids[t->n_pids++] = pid;
    trace_meta(t, pid, 0, "process_name", role);
    trace_sep(t); /* the coordinator first, then the workers, then the speculators */
    int order = !strcmp(role, "coordinator") ? 0 : !strncmp(role, "worker-", 7) ? 1 : 2;
    fprintf(t->f,
            "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}",
            pid, order);
}

int coord_trace_start(coord *c, const char *out, double seconds, const char *op, char *err,
                      size_t errlen)
{
    if (c->tracer) {
        snprintf(err, errlen, "a trace is already running (to %s, %.0f s left)", c->tracer->path,
                 (c->tracer->until_us - rt_now_us()) / 1e6);
        return -1;
    }
    if (!(seconds > 0 && seconds <= 3600)) {
        snprintf(err, errlen, "trace: %g seconds: give 0 < SECONDS <= 3600", seconds);
        return -1;
    }
    if (out[0] != '/' || strlen(out) >= sizeof c->tracer->path - 8) {
        snprintf(err, errlen, "trace: the output path must be absolute and shorter than %zu bytes",
                 sizeof c->tracer->path - 8);
        return -1;
    }
    struct coord_trace *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "trace: out of memory");
        return -1;
    }
    snprintf(t->path, sizeof t->path, "%s", out);
    snprintf(t->part, sizeof t->part, "%s.part", out);
    snprintf(t->op, sizeof t->op, "%s", op ? op : "");
    t->f = fopen(t->part, "w");
    if (!t->f) {
        snprintf(err, errlen, "trace: cannot write %s: %s", t->part, strerror(errno));
        free(t);
        return -1;
    }
    setvbuf(t->f, NULL, _IOFBF, 1 << 20);
    t->t0_us = rt_now_us();
    t->until_us = t->t0_us + (uint64_t)(seconds * 1e6);
    fputs("{\"traceEvents\":[", t->f);
    trace_process(t, (int)getpid(), "coordinator");
    trace_meta(t, (int)getpid(), COORD_TRACE_ENGINE, "thread_name", "verification loop");
    for (int s = 0; s < c->opt.n_seq; s++) {
        char nm[32];
        snprintf(nm, sizeof nm, "slot %d", s);
        trace_meta(t, (int)getpid(), COORD_TRACE_SLOT + s, "thread_name", nm);
    }
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        const coord_peer *p = &c->grp.peers[i];
        if (p->role != PEER_FREE && p->connected && p->pid > 0)
            trace_process(t, (int)p->pid, p->name);
    }
    c->tracer = t;
    rt_log("coordinator", "tracing for %.1f s to %s", seconds, out);
    return 0;
}

void coord_trace_poll(coord *c, bool force)
{
    struct coord_trace *t = c->tracer;
    if (!t)
        return;
    uint64_t now = rt_now_us();
    if (!force && now < t->until_us)
        return;
    double secs = (now - t->t0_us) / 1e6;
    char load[64] = "";
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (!fgets(load, sizeof load, la))
            load[0] = 0;
        fclose(la);
    }
    char *nl = strchr(load, ' ');
    for (int k = 0; nl && k < 2; k++) /* keep "1m 5m 15m" */
        nl = strchr(nl + 1, ' ');
    if (nl)
        *nl = 0;
    fprintf(t->f,
            "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"orochi_trace\":1,\"seconds\":%.3f,"
            "\"events\":%llu,\"load_average\":\"",
            secs, (unsigned long long)t->events);
    trace_str(t->f, load);
    fputs("\"}}\n", t->f);
    bool ok = !ferror(t->f);
    ok &= fclose(t->f) == 0;
    ok = ok && rename(t->part, t->path) == 0;
    if (ok)
        rt_log("coordinator", "trace written: %s (%llu events in %.1f s)", t->path,
               (unsigned long long)t->events, secs);
    else
        unlink(t->part);
    if (t->op[0]) {
        if (ok)
            coord_ops_answer(c, t->op, true, "%s: %llu events in %.1f s (load average %s)", t->path,
                             (unsigned long long)t->events, secs, load);
        else
            coord_ops_answer(c, t->op, false, "trace: writing %s failed: %s", t->path,
                             strerror(errno));
    }
    c->tracer = NULL;
    free(t);
}

void coord_trace_span(coord *c, int pid, const char *role, int tid, const char *name,
                      uint64_t start_us, uint64_t end_us, const char *args_fmt, ...)
{
    struct coord_trace *t = c->tracer;
    if (!t || start_us < t->t0_us || end_us < start_us)
        return;
    trace_process(t, pid, role);
    trace_sep(t);
    fprintf(t->f, "{\"ph\":\"X\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%llu,\"dur\":%llu",
            name, pid, tid, (unsigned long long)(start_us - t->t0_us),
            (unsigned long long)(end_us - start_us));
    if (args_fmt) {
        fputs(",\"args\":{", t->f);
        va_list ap;
        va_start(ap, args_fmt);
        vfprintf(t->f, args_fmt, ap);
        va_end(ap);
        fputc('}', t->f);
    }
    fputc('}', t->f);
}

void coord_trace_async(coord *c, const char *name, uint64_t id, uint64_t begin_us, uint64_t end_us)
{
    struct coord_trace *t = c->tracer;
    if (!t || begin_us < t->t0_us || end_us < begin_us)
        return;
    for (int k = 0; k < 2; k++) {
        trace_sep(t);
        fprintf(t->f,
                "{\"ph\":\"%c\",\"cat\":\"queue\",\"name\":\"%s\",\"id\":%llu,\"pid\":%d,"
                "\"tid\":%d,\"ts\":%llu}",
                k ? 'e' : 'b', name, (unsigned long long)id, (int)getpid(), COORD_TRACE_ENGINE,
                (unsigned long long)((k ? end_us : begin_us) - t->t0_us));
    }
}
