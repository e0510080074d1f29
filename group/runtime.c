#define _GNU_SOURCE
/*
 * group/runtime.c — framing and conventions shared by the coordinator, workers and speculators.
 *
 * A frame is one packed Envelope. Receiving validates before trusting anything: the payload must
 * unpack, carry a body, and carry our protocol version; anything else is reported to the caller as
 * a bad frame (logged and ignored by the roles, answered with an Error when the version is wrong),
 * never a crash. ROUTER sockets prefix the peer identity as its own frame.
 */
#include <stdarg.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "group/runtime.h"

#define RT_MAX_FRAME (1u << 20)

void rt_stamp(uint64_t *at)
{
    __atomic_store_n(at, rt_now_us(), __ATOMIC_RELAXED);
}

uint64_t rt_age_us(const uint64_t *at)
{
    uint64_t t = __atomic_load_n(at, __ATOMIC_RELAXED), now = rt_now_us();
    return now > t ? now - t : 0;
}

bool rt_life_due(rt_life *l, bool may_stall)
{
    uint64_t quiet = rt_age_us(&l->alive_us);
    if (may_stall && quiet > (uint64_t)l->stall_ms * 1000u) {
        if (!__atomic_exchange_n(&l->stalled, true, __ATOMIC_RELAXED))
            rt_log(l->role, "main thread silent for %llu ms: no more heartbeats",
                   (unsigned long long)(quiet / 1000));
        return false;
    }
    if (__atomic_exchange_n(&l->stalled, false, __ATOMIC_RELAXED))
        rt_log(l->role, "main thread alive again: heartbeating");
    if (rt_age_us(&l->hb_sent_us) < RT_HEARTBEAT_MS * 1000u)
        return false;
    rt_stamp(&l->hb_sent_us);
    return true;
}

uint64_t rt_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static __thread char rt_last_msg[1024]; /* this thread's last rt_log message (rt_log_last) */

const char *rt_log_last(void)
{
    return rt_last_msg;
}

void rt_log(const char *role, const char *fmt, ...)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char stamp[32], msg[1024];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s.%03d %s: %s\n", stamp, (int)(tv.tv_usec / 1000), role, msg);
    memcpy(rt_last_msg, msg, sizeof msg);
}

int rt_futex_wait(uint32_t *addr, uint32_t expected, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    return (int)syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void rt_futex_wake(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void rt_ctl_endpoint(const char *run_dir, char *out, size_t len)
{
    snprintf(out, len, "ipc://%s/ctl", run_dir);
}

uint64_t rt_fnv1a(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    if (!h)
        h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void rt_arena_name(const char *run_dir, char *out, size_t len)
{
    char abs[4096];
    const char *path = realpath(run_dir, abs) ? abs : run_dir;
    snprintf(out, len, "/orochi-%016llx", (unsigned long long)rt_fnv1a(0, path, strlen(path)));
}

Orochi__Envelope *rt_env(Orochi__Envelope *env, Orochi__Envelope__BodyCase which, void *body)
{
    orochi__envelope__init(env);
    env->version = OROCHI_PROTOCOL_VERSION;
    env->body_case = which;
    switch (which) {
    case OROCHI__ENVELOPE__BODY_HELLO: env->hello = body; break;
    case OROCHI__ENVELOPE__BODY_WELCOME: env->welcome = body; break;
    case OROCHI__ENVELOPE__BODY_STEP_BEGIN: env->step_begin = body; break;
    case OROCHI__ENVELOPE__BODY_STEP_DONE: env->step_done = body; break;
    case OROCHI__ENVELOPE__BODY_HEARTBEAT: env->heartbeat = body; break;
    case OROCHI__ENVELOPE__BODY_DRAFT_REQUEST: env->draft_request = body; break;
    case OROCHI__ENVELOPE__BODY_DRAFT_READY: env->draft_ready = body; break;
    case OROCHI__ENVELOPE__BODY_FEEDBACK: env->feedback = body; break;
    case OROCHI__ENVELOPE__BODY_SHUTDOWN: env->shutdown = body; break;
    case OROCHI__ENVELOPE__BODY_ERROR: env->error = body; break;
    case OROCHI__ENVELOPE__BODY_RECONFIGURE: env->reconfigure = body; break;
    default: break;
    }
    return env;
}

int rt_send(void *sock, const void *identity, size_t id_len, Orochi__Envelope *env)
{
    env->version = OROCHI_PROTOCOL_VERSION;
    size_t n = orochi__envelope__get_packed_size(env);
    uint8_t stack[4096];
    uint8_t *buf = n <= sizeof stack ? stack : malloc(n);
    if (!buf)
        return -1;
    orochi__envelope__pack(env, buf);
    int rc = 0;
    if (identity && zmq_send(sock, identity, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        rc = -1;
    if (!rc && zmq_send(sock, buf, n, ZMQ_DONTWAIT) < 0)
        rc = -1;
    if (buf != stack)
        free(buf);
    return rc;
}

static bool rt_more(void *sock)
{
    int more = 0;
    size_t sz = sizeof more;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

/* Drop the rest of a multipart message. */
static void rt_drain(void *sock)
{
    int more = 1;
    size_t sz = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sock, 0);
        zmq_msg_close(&m);
        sz = sizeof more;
    }
}

Orochi__Envelope *rt_recv(void *sock, bool router, uint8_t *id, size_t cap, size_t *id_len,
                          bool *bad, char *err, size_t errlen)
{
    *bad = false;
    zmq_msg_t m;
    if (router) {
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return NULL;
        }
        size_t n = zmq_msg_size(&m);
        *id_len = n < cap ? n : cap;
        memcpy(id, zmq_msg_data(&m), *id_len);
        zmq_msg_close(&m);
        if (!rt_more(sock)) {
            *bad = true;
            snprintf(err, errlen, "frame without payload");
            return NULL;
        }
    }
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, router ? 0 : ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return NULL;
    }
    size_t n = zmq_msg_size(&m);
    Orochi__Envelope *env = NULL;
    if (n > RT_MAX_FRAME) {
        *bad = true;
        snprintf(err, errlen, "frame of %zu bytes exceeds the %u-byte limit", n, RT_MAX_FRAME);
    } else if (!(env = orochi__envelope__unpack(NULL, n, zmq_msg_data(&m)))) {
        *bad = true;
        snprintf(err, errlen, "malformed frame of %zu bytes (not an orochi Envelope)", n);
    } else if (env->version != OROCHI_PROTOCOL_VERSION) {
        *bad = true;
        snprintf(err, errlen, "peer speaks protocol version %u, this build speaks %u", env->version,
                 OROCHI_PROTOCOL_VERSION);
        orochi__envelope__free_unpacked(env, NULL);
        env = NULL;
    } else if (env->body_case == OROCHI__ENVELOPE__BODY__NOT_SET) {
        *bad = true;
        snprintf(err, errlen, "envelope without a message body");
        orochi__envelope__free_unpacked(env, NULL);
        env = NULL;
    }
    zmq_msg_close(&m);
    rt_drain(sock);
    return env;
}

void rt_free(Orochi__Envelope *env)
{
    if (env)
        orochi__envelope__free_unpacked(env, NULL);
}

void rt_pin_from_env(const char *role, const char *var, int index)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return;
    int cpus[256], n = 0;
    for (const char *p = v; *p && n < 256;) {
        char *end;
        long c = strtol(p, &end, 10);
        if (end == p)
            break;
        cpus[n++] = (int)c;
        p = *end == ',' ? end + 1 : end;
    }
    if (!n)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[(index < 0 ? 0 : index) % n], &set);
    if (sched_setaffinity(0, sizeof set, &set))
        rt_log(role, "%s: cannot pin to CPU %d", var, cpus[(index < 0 ? 0 : index) % n]);
    else
        rt_log(role, "pinned to CPU %d (%s)", cpus[(index < 0 ? 0 : index) % n], var);
}
