/*
 * coordinator/coord_ops.c — operator requests from `orochi-launch`: trace, swap, detach.
 *
 * The launcher writes a request as RUN_DIR/ops/NAME.req, one argument per line with the command
 * first, under a temporary name renamed into place (the coordinator never reads half a file). The
 * main loop looks for requests at most every 100 ms and only between verification cycles, never
 * inside a step; it removes the file and answers in RUN_DIR/ops/NAME.out: "ok" or "error" on the
 * first line, then one line of text. Requests:
 *
 *   trace SECONDS OUT    write the step timeline to OUT (coord_trace.c); answered when written.
 *   swap ROLE OPT...     start ROLE again with OPT merged into its command line (`--threads 2`,
 *                        `--kind layerskip`, `--draft M.gguf`, ...): the old process is stopped
 *                        between steps (SIGTERM; a worker is idle then, a speculator only drafts),
 *                        the new one is started at once, and the answer comes when it has joined
 *                        (a worker: mapped everything and said "ready"). If it exits before
 *                        joining, or has not joined in 120 s, the old command line comes back and
 *                        the answer is an error with the new process's last log line. A step that
 *                        needs the swapped worker waits for it, as after a crash, so no request is
 *                        lost and greedy output cannot change.
 *   detach ID            stop speculator ID for good: its drafts leave the vote at once, it is
 *                        told to stop (SIGTERM if we spawned it, else Shutdown), never respawned,
 *                        and its slot and draft ring are freed. Answered when it is gone.
 *
 * Only roles the coordinator spawned can be swapped here; `orochi-launch swap` restarts a
 * speculator attached with attach-speculator itself.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coordinator/coord.h"

#define OPS_POLL_US 100000u
#define OPS_JOIN_US 120000000u  /* a swapped role must join within this */
#define OPS_DETACH_US 10000000u /* a detached speculator gets this long to stop, then SIGKILL */
#define OPS_MAX_ARGS 24
#define OPS_MAX_BYTES 8192

static coord_peer *ops_peer(coord *c, const char *name)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role != PEER_FREE && !strcmp(c->grp.peers[i].name, name))
            return &c->grp.peers[i];
    return NULL;
}

static void ops_roles(const coord *c, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < COORD_MAX_PEERS && n < len; i++)
        if (c->grp.peers[i].role != PEER_FREE)
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? ", " : "", c->grp.peers[i].name);
}

/* the last non-empty line of ROLE's log (why a new process failed) */
static void ops_log_tail(const coord *c, const char *role, char *out, size_t len)
{
    char path[4400], line[512];
    snprintf(path, sizeof path, "%s/logs/%s.log", c->opt.run_dir, role);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (fseek(f, -4096, SEEK_END))
        rewind(f);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0])
            snprintf(out, len, "%.256s", line);
    }
    fclose(f);
}

/* argv with the options of `opt` (n of them) merged in: "--name value" replaces that option's
 * value, an option not there is appended */
static int ops_merge(char **out, char *const *argv, char **opt, int n, char *err, size_t errlen)
{
    int m = 0;
    for (; m < COORD_MAX_SPAWN_ARGS - 1 && argv[m]; m++)
        out[m] = strdup(argv[m]);
    for (int i = 0; i < n; i++) {
        const char *name = opt[i];
        const char *val = i + 1 < n && strncmp(opt[i + 1], "--", 2) ? opt[++i] : NULL;
        if (strncmp(name, "--", 2) || !name[2]) {
            snprintf(err, errlen, "swap: '%s' is not an option (--name [value])", name);
            return -1;
        }
        if (!strcmp(name, "--run-dir") || !strcmp(name, "--index") || !strcmp(name, "--id")) {
            snprintf(err, errlen, "swap: %s cannot change (it is what makes the role this role)",
                     name);
            return -1;
        }
        int at = -1;
        for (int k = 1; k < m; k++)
            if (!strcmp(out[k], name))
                at = k;
        bool has_val = at >= 0 && at + 1 < m && strncmp(out[at + 1], "--", 2);
        if (at >= 0 && val && has_val) {
            free(out[at + 1]);
            out[at + 1] = strdup(val);
            continue;
        }
        if (at >= 0 && !val && !has_val)
            continue; /* a flag already there */
        if (at >= 0) {
            snprintf(err, errlen, "swap: %s %s a value here", name, val ? "takes no" : "needs");
            return -1;
        }
        if (m + (val ? 2 : 1) >= COORD_MAX_SPAWN_ARGS) {
            snprintf(err, errlen, "swap: too many options (at most %d arguments in all)",
                     COORD_MAX_SPAWN_ARGS - 1);
            return -1;
        }
        out[m++] = strdup(name);
        if (val)
            out[m++] = strdup(val);
    }
    return 0;
}

static void ops_swap(coord *c, const char *op, char **args, int n)
{
    char err[512], roles[1024];
    if (n < 2) {
        coord_ops_answer(c, op, false, "swap: usage: swap ROLE --option [value] ...");
        return;
    }
    coord_peer *p = ops_peer(c, args[0]);
    if (!p) {
        ops_roles(c, roles, sizeof roles);
        coord_ops_answer(c, op, false, "swap: no role '%s' (roles: %s)", args[0], roles);
        return;
    }
    if (!p->argv[0]) {
        coord_ops_answer(c, op, false,
                         "swap: %s was started outside the coordinator (attach-speculator or "
                         "debug): orochi-launch swap restarts it itself",
                         p->name);
        return;
    }
    if (p->swap || p->detaching) {
        coord_ops_answer(c, op, false, "swap: %s is already being %s", p->name,
                         p->swap ? "swapped" : "detached");
        return;
    }
    char *argv[COORD_MAX_SPAWN_ARGS] = {0};
    if (ops_merge(argv, p->argv, args + 1, n - 1, err, sizeof err)) {
        coord_free_argv(argv);
        coord_ops_answer(c, op, false, "%s", err);
        return;
    }
    for (int i = 0; i < COORD_MAX_SPAWN_ARGS; i++) {
        p->old_argv[i] = p->argv[i];
        p->argv[i] = argv[i];
    }
    if (p->role == PEER_SPECULATOR)
        coord_group_speculator_placement(c, p);
    snprintf(p->op, sizeof p->op, "%s", op);
    p->op_deadline_us = rt_now_us() + OPS_JOIN_US;
    rt_log("coordinator", "swapping %s (pid %d)", p->name, (int)(p->child ? p->child : p->pid));
    if (p->role == PEER_SPECULATOR) { /* another drafter: it earns its vote weight anew */
        memset(&p->acr, 0, sizeof p->acr);
        p->reply_ema_us = p->accept_ema = p->draft_ema_us = p->draft_work_ema_us = 0;
        p->reply_n = p->accept_n = p->draft_n = p->draft_work_n = 0;
        p->unscored = p->benched = p->bench_interval = 0;
    }
    p->ready = false; /* a worker: no step is rung for it any more; the engine waits for the new
                       * one as after a crash */
    if (p->child) {
        p->swap = SWAP_STOPPING;
        kill(p->child, SIGTERM); /* between steps: it leaves at once */
    } else { /* not running now (a respawn is due): start the new configuration instead */
        p->swap = SWAP_STARTED;
        p->connected = false;
        coord_group_spawn(c, p);
    }
}

static void ops_detach_done(coord *c, coord_peer *p, const char *how)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/cmd/%s", c->opt.run_dir, p->name);
    unlink(path);
    if (p->op[0])
        coord_ops_answer(c, p->op, true, "%s detached (%s)", p->name, how);
    coord_free_argv(p->argv);
    coord_free_argv(p->old_argv);
    memset(p, 0, sizeof *p); /* PEER_FREE: its slot and draft ring are free */
}

static void ops_detach(coord *c, const char *op, char **args, int n)
{
    char roles[1024];
    coord_peer *p = n == 1 ? ops_peer(c, args[0]) : NULL;
    if (n != 1) {
        coord_ops_answer(c, op, false, "detach: usage: detach SPECULATOR_ID");
        return;
    }
    if (!p || p->role != PEER_SPECULATOR) {
        ops_roles(c, roles, sizeof roles);
        coord_ops_answer(c, op, false, "detach: '%s' is not a speculator of this group (roles: %s)",
                         args[0], roles);
        return;
    }
    if (p->swap || p->detaching) {
        coord_ops_answer(c, op, false, "detach: %s is already being %s", p->name,
                         p->swap ? "swapped" : "detached");
        return;
    }
    if (p->connected) {
        Orochi__Shutdown s = OROCHI__SHUTDOWN__INIT;
        s.reason = "detached by the operator";
        coord_group_send(c, p, OROCHI__ENVELOPE__BODY_SHUTDOWN, &s);
    }
    /* out of the vote from this cycle on */
    p->connected = false;
    p->ident_len = 0;
    p->detaching = true;
    p->respawn_at_us = 0;
    memset(p->slot_draft, 0, sizeof p->slot_draft);
    snprintf(p->op, sizeof p->op, "%s", op);
    rt_log("coordinator", "detaching %s (pid %d)", p->name, (int)(p->child ? p->child : p->pid));
    if (p->child) {
        kill(p->child, SIGTERM);
        p->op_deadline_us = rt_now_us() + OPS_DETACH_US; /* answered when it has exited */
    } else {
        char how[96];
        snprintf(how, sizeof how, "pid %d was told to stop", (int)p->pid);
        ops_detach_done(c, p, how);
    }
}

static void ops_trace(coord *c, const char *op, char **args, int n)
{
    char err[512];
    if (n != 2) {
        coord_ops_answer(c, op, false, "trace: usage: trace SECONDS OUT.json");
        return;
    }
    char *end;
    double secs = strtod(args[0], &end);
    if (end == args[0] || *end) {
        coord_ops_answer(c, op, false, "trace: '%s' is not a number of seconds", args[0]);
        return;
    }
    if (coord_trace_start(c, args[1], secs, op, err, sizeof err))
        coord_ops_answer(c, op, false, "%s", err);
}

/* read and run one request file (removed first: a request runs once) */
static void ops_run(coord *c, const char *dir, const char *file)
{
    char path[4400], op[64];
    snprintf(path, sizeof path, "%.4000s/%.255s", dir, file);
    size_t nl = strlen(file) - 4; /* without ".req" */
    snprintf(op, sizeof op, "%.*s", (int)(nl < sizeof op ? nl : sizeof op - 1), file);
    FILE *f = fopen(path, "r");
    unlink(path);
    if (!f)
        return;
    char buf[OPS_MAX_BYTES + 1];
    size_t got = fread(buf, 1, OPS_MAX_BYTES + 1, f);
    fclose(f);
    if (got > OPS_MAX_BYTES) {
        coord_ops_answer(c, op, false, "request of more than %d bytes", OPS_MAX_BYTES);
        return;
    }
    buf[got] = 0;
    char *args[OPS_MAX_ARGS];
    int n = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (n == OPS_MAX_ARGS) {
            coord_ops_answer(c, op, false, "request with more than %d lines", OPS_MAX_ARGS);
            return;
        }
        args[n++] = line;
    }
    if (!n) {
        coord_ops_answer(c, op, false, "empty request");
        return;
    }
    rt_log("coordinator", "operator request %s: %s", op, args[0]);
    if (!strcmp(args[0], "trace"))
        ops_trace(c, op, args + 1, n - 1);
    else if (!strcmp(args[0], "swap"))
        ops_swap(c, op, args + 1, n - 1);
    else if (!strcmp(args[0], "detach"))
        ops_detach(c, op, args + 1, n - 1);
    else
        coord_ops_answer(c, op, false, "unknown request '%.64s' (trace, swap, detach)", args[0]);
}

bool coord_ops_on_exit(coord *c, coord_peer *p, const char *why)
{
    if (p->detaching) {
        ops_detach_done(c, p, why);
        return true;
    }
    if (p->swap == SWAP_STOPPING) { /* the old process left: the new configuration starts now */
        rt_log("coordinator", "%s (old configuration) %s; starting the new one", p->name, why);
        p->connected = false;
        p->ready = false;
        p->ident_len = 0;
        p->swap = SWAP_STARTED;
        if (p->role == PEER_WORKER)
            c->on.worker_lost(c, p);
        coord_group_spawn(c, p);
        return true;
    }
    if (p->swap == SWAP_STARTED && !p->connected) { /* the new one died before joining */
        char tail[300];
        ops_log_tail(c, p->name, tail, sizeof tail);
        coord_peer_error(p, "swap failed: the new process %s", why);
        coord_ops_answer(c, p->op, false,
                         "swap: the new %s %s before joining (its log: %s); the previous "
                         "configuration is back",
                         p->name, why, tail[0] ? tail : "empty");
        coord_free_argv(p->argv);
        for (int i = 0; i < COORD_MAX_SPAWN_ARGS; i++) {
            p->argv[i] = p->old_argv[i];
            p->old_argv[i] = NULL;
        }
        if (p->role == PEER_SPECULATOR)
            coord_group_write_cmd(c, p);
        p->swap = SWAP_NONE;
        p->op[0] = 0;
        coord_group_spawn(c, p);
        return true;
    }
    return false;
}

/* swaps whose new process joined (or took too long), detaches that took too long */
static void ops_progress(coord *c)
{
    uint64_t now = rt_now_us();
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_FREE)
            continue;
        if (p->swap == SWAP_STARTED && p->connected && (p->role != PEER_WORKER || p->ready)) {
            char line[600];
            size_t n = 0;
            for (int a = 1; a < COORD_MAX_SPAWN_ARGS && p->argv[a] && n < sizeof line; a++)
                if (strcmp(p->argv[a - 1], "--run-dir") && strcmp(p->argv[a], "--run-dir"))
                    n += (size_t)snprintf(line + n, sizeof line - n, " %s", p->argv[a]);
            coord_ops_answer(c, p->op, true, "%s swapped: pid %d,%s", p->name, (int)p->pid, line);
            coord_group_write_cmd(c, p);
            coord_free_argv(p->old_argv);
            p->swap = SWAP_NONE;
            p->op[0] = 0;
            p->swaps++;
        } else if (p->swap && now > p->op_deadline_us && p->child) {
            kill(p->child, SIGKILL); /* coord_ops_on_exit puts the old configuration back */
            p->swap = SWAP_STARTED;
            p->connected = false;
        } else if (p->detaching && p->child && now > p->op_deadline_us) {
            kill(p->child, SIGKILL);
        }
    }
}

void coord_ops_poll(coord *c)
{
    uint64_t now = rt_now_us();
    coord_trace_poll(c, false);
    if (now - c->ops_checked_us < OPS_POLL_US)
        return;
    c->ops_checked_us = now;
    ops_progress(c);
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/ops", c->opt.run_dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    char names[8][256];
    int n = 0;
    for (struct dirent *e; n < 8 && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] != '.' && l > 4 && l < sizeof names[0] &&
            !strcmp(e->d_name + l - 4, ".req"))
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        ops_run(c, dir, names[i]);
}
