/*
 * tests/fuzz/fuzz_proto — libFuzzer target for the control plane's receive path: a ZeroMQ frame
 * through rt_recv (group/runtime.c: size limit, protobuf-c unpack of the Envelope, protocol
 * version, body present), then, on the coordinator's side, the dispatch of what it accepted
 * (coordinator/coord_group.c: group_dispatch -> group_hello, heartbeats, and
 * coord_engine_on_step_done / coord_engine_on_draft_ready in coordinator/coord_step.c and
 * coord_drafts.c) against
 * a coordinator state with a real arena and draft rings.
 *
 * The frames really travel through ZeroMQ (inproc sockets: a DEALER to the coordinator's ROUTER,
 * a PAIR for the peer side), because rt_recv is the narrowest non-static entry point: the
 * validation is inline in it. group_dispatch is static, so this file compiles
 * coordinator/coord_group.c into itself (#include below), reads the engine's state through
 * coordinator/engine.h (it sets up sequence slots in use), and links the rest of the
 * coordinator but its main(). The routing id handed to group_dispatch is the one the input names (a peer
 * picks its own with ZMQ_ROUTING_ID, 1..255 bytes; rt_recv copies up to the caller's 256).
 * Worker- and speculator-side handling of Welcome/Feedback is not reached: it lives in static
 * functions of workers/worker.c and workers/speculator.c, next to model loading and arena attach
 * (see docs/fuzzing.md).
 *
 * Input: records, each: flags (1 byte), id length L (1 byte), L id bytes, payload length P (2
 * bytes, little-endian), P payload bytes (a short last record takes what is left).
 *   flags bit 0: peer side (rt_recv on a PAIR, router = false) instead of the coordinator's
 *   flags bit 1: a second, trailing frame follows the payload (rt_recv must drain it)
 *   flags & 0xF4 == 0xF4: the payload is zero-padded past RT_MAX_FRAME (1 MiB), refused before
 *     unpacking (rare on purpose: a 1 MiB frame costs a hundred small ones)
 * The coordinator state is reset for every input (2 workers, sequence slots 0 and 1 in use by
 * requests 7 and 8, eight empty draft rings), so a Hello record followed by others from the same
 * id exercises a joined peer.
 *
 * Checked: rt_recv returns an envelope or reports a bad frame with a one-line error, never both
 * and never neither (a frame was sent), and leaves no frame of the message behind; an accepted
 * envelope has our version, a body whose pointer is set, readable strings and repeated fields,
 * and packs back to bytes that unpack and pack again identically (unless it holds unknown fields:
 * see the note at the check). After each dispatch the peer table is sane: routing ids fit their
 * buffer, names and kinds are NUL-terminated, workers hold distinct indices below n_workers, at
 * most eight speculators hold distinct ring indices, and every DraftReady a peer left behind can
 * be read out of its ring as engine_gather_drafts does (arena_draft_ring_get with its slot).
 *
 * The code under test logs a line for most messages; run with -close_fd_mask=2 (run_fuzz.sh does)
 * and this file's own reports still reach the terminal.
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds: tests/fuzz/corpus/proto/).
 */
#include "coordinator/coord_group.c" /* static group_dispatch: compiled into this file */
#include "coordinator/engine.h"

#include "tests/fuzz/fuzz_common.h"

/* coordinator/coord_main.c's, which is not linked in */
volatile int coord_stop_flag;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_N_WORKERS 2
#define FZ_VOCAB 300
#define FZ_VOCAB_HASH 0x1234abcdull

static struct {
    void *zctx, *router, *dealer, *pair_tx, *pair_rx;
    arena *arena;
    coord *c;
    llama_model *model;
} fz;

static void fz_cleanup(void)
{
    arena_destroy(&fz.arena); /* unlinks the object: no leftovers in /dev/shm */
}

static void *fz_socket(int type)
{
    void *s = zmq_socket(fz.zctx, type);
    int zero = 0;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero))
        fuzz_fail("zmq_socket: %s", zmq_strerror(zmq_errno()));
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* keep a way to the terminal for our own reports when -close_fd_mask=2 closes stderr */
    fuzz_report_fd = dup(2);
    if (fuzz_report_fd < 0)
        fuzz_report_fd = 2;

    char name[64], err[256];
    snprintf(name, sizeof name, "/orochi-fuzz-proto-%d", (int)getpid());
    arena_spec spec = {RT_REGION_DRAFTS, (uint64_t)RT_MAX_SPECULATORS * rt_ring_stride()};
    fz.arena = arena_create(name, &spec, 1, true, err, sizeof err);
    if (!fz.arena)
        fuzz_fail("arena_create: %s", err);
    atexit(fz_cleanup);

    fz.zctx = zmq_ctx_new();
    fz.router = fz_socket(ZMQ_ROUTER);
    fz.dealer = fz_socket(ZMQ_DEALER);
    fz.pair_tx = fz_socket(ZMQ_PAIR);
    fz.pair_rx = fz_socket(ZMQ_PAIR);
    zmq_setsockopt(fz.dealer, ZMQ_ROUTING_ID, "peer", 4);
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://fuzz-proto-%d", (int)getpid());
    if (zmq_bind(fz.router, ep) || zmq_connect(fz.dealer, ep))
        fuzz_fail("zmq bind/connect %s: %s", ep, zmq_strerror(zmq_errno()));
    snprintf(ep, sizeof ep, "inproc://fuzz-proto-pair-%d", (int)getpid());
    if (zmq_bind(fz.pair_rx, ep) || zmq_connect(fz.pair_tx, ep))
        fuzz_fail("zmq bind/connect %s: %s", ep, zmq_strerror(zmq_errno()));

    fz.model = calloc(1, sizeof *fz.model);
    fz.c = calloc(1, sizeof *fz.c);
    if (!fz.model || !fz.c)
        abort();
    fz.model->cfg.vocab = FZ_VOCAB;
    coord *c = fz.c;
    c->grp.sock = fz.router;
    c->grp.arena = fz.arena;
    c->grp.rings = arena_region_find(fz.arena, RT_REGION_DRAFTS, NULL);
    c->grp.ring_bytes = rt_ring_stride();
    c->model = fz.model;
    c->vocab_hash = FZ_VOCAB_HASH;
    c->opt.target = "fuzz.gguf";
    c->opt.n_workers = FZ_N_WORKERS;
    c->opt.max_width = 16;
    c->opt.n_ctx = 256;
    c->opt.n_seq = 2;
    c->opt.dead_ms = 5000;
    pthread_mutex_init(&c->met.lock, NULL);
    pthread_mutex_init(&c->qlock, NULL);
    if (coord_engine_init(c))
        abort();
    return 0;
}

/* The coordinator as it is before any peer joined, with two requests in flight. */
static void fz_reset(void)
{
    coord *c = fz.c;
    memset(c->grp.peers, 0, sizeof c->grp.peers);
    memset(c->eng, 0, sizeof *c->eng);
    c->eng->slots[0].used = true;
    c->eng->slots[0].req_id = 7;
    c->eng->slots[1].used = true;
    c->eng->slots[1].req_id = 8;
    for (int r = 0; r < RT_MAX_SPECULATORS; r++)
        memset((uint8_t *)c->grp.rings + (size_t)r * c->grp.ring_bytes, 0, c->grp.ring_bytes);
}

static void fz_touch_str(const char *s, const char *what)
{
    if (!s)
        fuzz_fail("%s: NULL string in an accepted envelope", what);
    volatile size_t n = strlen(s);
    (void)n;
}

/* Everything an accepted envelope exposes must be readable and consistent. */
static void fz_check_envelope(const Orochi__Envelope *env)
{
    if (env->version != OROCHI_PROTOCOL_VERSION)
        fuzz_fail("accepted version %u", env->version);
    const void *body = NULL;
    switch (env->body_case) {
    case OROCHI__ENVELOPE__BODY_HELLO:
        body = env->hello;
        if (body) {
            fz_touch_str(env->hello->id, "hello.id");
            fz_touch_str(env->hello->device, "hello.device");
            fz_touch_str(env->hello->kind, "hello.kind");
        }
        break;
    case OROCHI__ENVELOPE__BODY_WELCOME:
        body = env->welcome;
        if (body) {
            fz_touch_str(env->welcome->arena_name, "welcome.arena_name");
            fz_touch_str(env->welcome->target_model, "welcome.target_model");
        }
        break;
    case OROCHI__ENVELOPE__BODY_STEP_BEGIN: body = env->step_begin; break;
    case OROCHI__ENVELOPE__BODY_STEP_DONE:
        body = env->step_done;
        if (body)
            fz_touch_str(env->step_done->error, "step_done.error");
        break;
    case OROCHI__ENVELOPE__BODY_HEARTBEAT:
        body = env->heartbeat;
        if (body)
            fz_touch_str(env->heartbeat->state, "heartbeat.state");
        break;
    case OROCHI__ENVELOPE__BODY_DRAFT_REQUEST: body = env->draft_request; break;
    case OROCHI__ENVELOPE__BODY_DRAFT_READY: body = env->draft_ready; break;
    case OROCHI__ENVELOPE__BODY_FEEDBACK:
        body = env->feedback;
        if (body) {
            if (env->feedback->n_tokens && !env->feedback->tokens)
                fuzz_fail("feedback: %zu tokens, no array", env->feedback->n_tokens);
            volatile int32_t x = 0;
            for (size_t i = 0; i < env->feedback->n_tokens; i++)
                x ^= env->feedback->tokens[i];
            (void)x;
        }
        break;
    case OROCHI__ENVELOPE__BODY_SHUTDOWN:
        body = env->shutdown;
        if (body)
            fz_touch_str(env->shutdown->reason, "shutdown.reason");
        break;
    case OROCHI__ENVELOPE__BODY_ERROR:
        body = env->error;
        if (body)
            fz_touch_str(env->error->message, "error.message");
        break;
    case OROCHI__ENVELOPE__BODY_RECONFIGURE:
        body = env->reconfigure;
        if (body) {
            if (env->reconfigure->n_shares && !env->reconfigure->shares)
                fuzz_fail("reconfigure: %zu shares, no array", env->reconfigure->n_shares);
            volatile float x = 0;
            for (size_t i = 0; i < env->reconfigure->n_shares; i++)
                x += env->reconfigure->shares[i];
            (void)x;
        }
        break;
    default: fuzz_fail("accepted an envelope with body case %d", env->body_case);
    }
    if (!body)
        fuzz_fail("body case %d with a NULL body", env->body_case);

    /* pack -> unpack -> pack is stable */
    size_t n = orochi__envelope__get_packed_size(env);
    uint8_t *a = malloc(n ? n : 1), *b = NULL;
    if (!a)
        abort();
    if (orochi__envelope__pack(env, a) != n)
        fuzz_fail("pack wrote other than get_packed_size's %zu bytes", n);
    Orochi__Envelope *again = orochi__envelope__unpack(NULL, n, a);
    if (!again) {
        /* protobuf-c 1.4 keeps unknown fields it should have refused (field number 0 written as
         * an overlong varint) and packs them back in a form its own unpack refuses: harmless here,
         * since nobody re-sends a received envelope. Without unknown fields it must round-trip. */
        if (env->base.n_unknown_fields || ((const ProtobufCMessage *)body)->n_unknown_fields) {
            free(a);
            return;
        }
        fuzz_fail("an accepted envelope packs to %zu bytes that do not unpack", n);
    }
    size_t m = orochi__envelope__get_packed_size(again);
    b = malloc(m ? m : 1);
    if (!b)
        abort();
    orochi__envelope__pack(again, b);
    if (m != n || memcmp(a, b, n))
        fuzz_fail("pack(unpack(pack(x))) != pack(x) (%zu vs %zu bytes)", m, n);
    orochi__envelope__free_unpacked(again, NULL);
    free(a);
    free(b);
}

/* The peer table after a dispatch. */
static void fz_check_peers(void)
{
    const coord *c = fz.c;
    bool worker_seen[FZ_N_WORKERS] = {0}, ring_seen[RT_MAX_SPECULATORS] = {0};
    int n_spec = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        const coord_peer *p = &c->grp.peers[i];
        if (p->ident_len > sizeof p->ident)
            fuzz_fail("peer %d: routing id of %zu bytes in a %zu-byte buffer", i, p->ident_len,
                      sizeof p->ident);
        if (!memchr(p->name, 0, sizeof p->name) || !memchr(p->kind, 0, sizeof p->kind))
            fuzz_fail("peer %d: name or kind not NUL-terminated", i);
        if (p->role == PEER_WORKER) {
            if (p->index < 0 || p->index >= c->opt.n_workers || worker_seen[p->index])
                fuzz_fail("worker peer %d holds index %d", i, p->index);
            worker_seen[p->index] = true;
        } else if (p->role == PEER_SPECULATOR) {
            if (p->index < 0 || p->index >= RT_MAX_SPECULATORS || ring_seen[p->index])
                fuzz_fail("speculator peer %d holds ring %d", i, p->index);
            ring_seen[p->index] = true;
            n_spec++;
            /* its DraftReadys, read as engine_gather_drafts reads them */
            const arena_draft_ring *ring =
                (const arena_draft_ring *)((const uint8_t *)c->grp.rings +
                                           (size_t)p->index * c->grp.ring_bytes);
            for (int s = 0; s < RT_MAX_SEQ; s++) {
                arena_draft d;
                if (p->draft_ready[s].fresh &&
                    arena_draft_ring_get(ring, RT_DRAFT_SLOTS, p->draft_ready[s].ring_slot, &d) &&
                    d.n > ARENA_DRAFT_MAX)
                    fuzz_fail("draft of %u tokens read from ring %d", d.n, p->index);
            }
        } else if (p->role != PEER_FREE) {
            fuzz_fail("peer %d has role %d", i, p->role);
        }
    }
    if (n_spec > RT_MAX_SPECULATORS)
        fuzz_fail("%d speculators joined", n_spec);
}

/* Drop whatever the coordinator answered to our own DEALER ("peer"). */
static void fz_drain(void *s)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int rc = zmq_msg_recv(&m, s, ZMQ_DONTWAIT);
        zmq_msg_close(&m);
        if (rc < 0)
            break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reset();
    const uint8_t *p = data, *end = data + size;
    while (end - p >= 2) {
        uint8_t flags = p[0];
        size_t id_len = p[1];
        p += 2;
        if (id_len > (size_t)(end - p))
            id_len = (size_t)(end - p);
        const uint8_t *id = p;
        p += id_len;
        size_t plen = (size_t)(end - p);
        if (plen >= 2) {
            size_t want = (size_t)p[0] | (size_t)p[1] << 8;
            p += 2;
            plen = want < (size_t)(end - p) ? want : (size_t)(end - p);
        } else {
            p = end;
            plen = 0;
        }
        const uint8_t *payload = p;
        p += plen;

        bool peer_side = flags & 1, trailer = flags & 2;
        void *tx = peer_side ? fz.pair_tx : fz.dealer, *rx = peer_side ? fz.pair_rx : fz.router;
        uint8_t *big = NULL;
        if ((flags & 0xF4) == 0xF4) {
            big = calloc(1, (1u << 20) + 1 + plen);
            if (!big)
                abort();
            memcpy(big, payload, plen);
            payload = big;
            plen += (1u << 20) + 1;
        }
        int sent = zmq_send(tx, payload, plen, trailer ? ZMQ_SNDMORE : 0);
        free(big);
        if (sent != (int)plen || (trailer && zmq_send(tx, "x", 1, 0) != 1))
            fuzz_fail("zmq_send: %s", zmq_strerror(zmq_errno()));
        uint8_t got_id[256];
        size_t got_id_len = 0;
        bool bad = true;
        char err[256] = "";
        /* inproc delivers at once: a non-blocking receive finds the frame (a poll first would
         * only cost time) */
        Orochi__Envelope *env =
            rt_recv(rx, !peer_side, got_id, sizeof got_id, &got_id_len, &bad, err, sizeof err);
        if (env && bad)
            fuzz_fail("rt_recv returned an envelope and reported a bad frame (%s)", err);
        if (!env && !bad)
            fuzz_fail("rt_recv returned nothing for a %zu-byte frame that had arrived", plen);
        if (bad)
            fuzz_check_err("rt_recv", err, sizeof err);
        if (!peer_side && !bad && (got_id_len != 4 || memcmp(got_id, "peer", 4)))
            fuzz_fail("rt_recv: routing id of %zu bytes, sent 'peer'", got_id_len);
        /* the trailing frame was drained: the next receive finds nothing */
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, rx, ZMQ_DONTWAIT) >= 0)
            fuzz_fail("rt_recv left a frame of the message behind");
        zmq_msg_close(&m);
        if (!env)
            continue;
        fz_check_envelope(env);
        /* routing ids up to 255 bytes reach group_hello, which must refuse those longer than
         * coord_peer.ident (ASan cannot see an overflow inside one struct; fz_check_peers does) */
        if (!peer_side && id_len > 0) {
            group_dispatch(fz.c, id, id_len, env);
            fz_check_peers();
            fz_drain(fz.dealer);
        }
        rt_free(env);
    }
    return 0;
}
