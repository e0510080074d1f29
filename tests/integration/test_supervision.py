"""Supervision: killing a role mid-request loses nothing.

The KV cache and the step inputs live in the arena, so when a worker dies during a request the
coordinator spawns it again and re-runs the interrupted step: the request must complete with
exactly the tokens of an undisturbed run, and the status file must show the worker back with
`restarts 1` — also while the workers draft by prompt lookup inside their free run. A dead
speculator only means fewer drafts (the request completes identically, the
speculator is restarted); a hung worker (SIGSTOP) is declared dead after --dead-ms and replaced,
and only it: its sibling, waiting for it at the step barrier, keeps heartbeating and is never
declared dead, also when the stop lasts as long as --dead-ms; a speculator busy with a long
prompt's prefill keeps heartbeating and is not restarted; a speculator attached while a request
runs joins the group and drafts for the next request; when the coordinator itself is killed, its
supervisor (orochi-launch) starts a new one and the group serves again within 5 s, and when the
supervisor is gone too, every other role exits on its own, the last one out removes the arena from
/dev/shm, and a new group starts in the same run directory.

The model is large enough (8 layers, dim 512) that a 200-token request takes a second or more on
two cores, so the kill lands while the request is being generated: the test waits for the first
streamed chunk before it kills.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROMPT = "the supervision test prompt"
N = 200


def slow_model():
    return G.mkmodel(layers=8, dim=512, ffn=1024, heads=8, kv_heads=2, vocab=300, ctx=512, type="f32", seed=7)


_WANT = {}


def want_ids(model):
    if model not in _WANT:
        _WANT[model] = G.run_ids(model, PROMPT, N)
        G.check(len(_WANT[model]) == N, "the reference stops after %d tokens; the test needs %d",
                len(_WANT[model]), N)
    return _WANT[model]


def role_pid(g, role):
    st = g.wait_status(lambda s: s.get(role, {}).get("connected"), 30, "%s connected" % role)
    return st[role]["pid"]


def wait_back(g, role, old_pid, restarts=1, timeout=60):
    st = g.wait_status(lambda s: s.get(role, {}).get("connected") and s[role]["pid"] != old_pid
                       and s[role]["restarts"] == restarts, timeout,
                       "%s back with a new pid and restarts %d" % (role, restarts))
    G.log("  status: %s" % st[role]["line"].strip())
    return st[role]["pid"]


def kill_mid_request(g, role, want):
    """SIGKILL `role` once a request is under way; the request must still give `want`. Returns
    the killed pid."""
    pid = role_pid(g, role)
    bg = G.Background(g, PROMPT, N)
    bg.wait_started()
    os.kill(pid, signal.SIGKILL)
    G.log("  killed %s (pid %d) mid-request" % (role, pid))
    G.check_eq(bg.result(), want, "token ids of the request that lost %s" % role)
    return pid


@t.case
def test_supervision_worker_sigkill_mid_request():
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-worker", model, workers=2) as g:
        t0 = time.time()
        G.check_eq(g.ids(PROMPT, N), want, "undisturbed group run")
        G.log("  undisturbed request: %.2fs" % (time.time() - t0))
        pid = kill_mid_request(g, "worker-1", want)
        new = wait_back(g, "worker-1", pid)
        G.check(not G.pid_alive(pid), "the killed worker %d is still there", pid)
        G.check(G.pid_alive(new), "the new worker-1 (pid %d) is not alive", new)
        clog = g.log("coordinator")
        G.check("worker-1 (pid %d) lost" % pid in clog, "coordinator.log does not report the loss")
        if "re-running" in clog:
            G.log("  the coordinator re-ran the interrupted step")
        # the group still serves, with the replacement worker
        G.check_eq(g.ids(PROMPT, 48), want[:48], "a request after the restart")
        G.check(g.status()["worker-0"]["restarts"] == 0, "worker-0 was restarted too")


@t.case
def test_supervision_model_file_replaced():
    """The target file is replaced (other weights, same shape and name) under a running group,
    then a worker dies: its replacement loads the new file, finds that its bytes are not the ones
    the coordinator started with, and refuses to join, saying so, instead of computing with other
    weights than its sibling's. Once the file is put back, the next respawn joins and the group
    serves the same tokens as before."""
    src = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, seed=21)
    other = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, seed=22)
    model = os.path.join(G.env()["tmp"], "replaced-under-group.gguf")
    shutil.copyfile(src, model)
    want = G.run_ids(model, PROMPT, 16)
    with G.Group("sup-replaced", model, workers=2) as g:
        G.check_eq(g.ids(PROMPT, 16), want, "before the replacement")
        tmp = model + ".new"
        shutil.copyfile(other, tmp)
        os.replace(tmp, model)
        pid = role_pid(g, "worker-1")
        os.kill(pid, signal.SIGKILL)
        g.wait_log("worker-1", "is not the file the group started with", timeout=60)
        G.log("  the respawned worker refused: %s" % [l for l in g.log("worker-1").splitlines()
                                                       if "not the file" in l][-1].strip())
        shutil.copyfile(src, tmp)
        os.replace(tmp, model)
        g.wait_status(lambda s: s.get("worker-1", {}).get("connected"), 90,
                      "worker-1 back once the file is the group's again")
        G.check_eq(g.ids(PROMPT, 16), want, "after the file was put back")


@t.case
def test_supervision_worker_sigkill_mid_lookup_run():
    # the same with ngram and a plan whose curve makes drafting cheap: the workers draft by
    # prompt lookup inside their free run when one of them is killed; the answer stays exact
    model = slow_model()
    want = want_ids(model)
    plan = G.write_plan(os.path.join(G.env()["tmp"], "plan-sup-lookup.json"), [1.0, 1.01, 1.02, 1.04, 1.08])
    with G.Group("sup-lookup", model, workers=2, speculators=["ngram"], extra=["--plan", plan]) as g:
        pid = kill_mid_request(g, "worker-0", want)
        wait_back(g, "worker-0", pid)
        r = g.complete(PROMPT, N)
        G.check_eq(r["orochi"]["token_ids"], want, "a request after the restart")
        G.check(r["orochi"]["mean_accepted"] > 1, "no lookup drafts after the restart (mean accepted %s)",
                r["orochi"]["mean_accepted"])
        G.log("  after the restart: exact, mean accepted %.2f" % r["orochi"]["mean_accepted"])


@t.case
def test_supervision_worker_sigstop_declared_dead():
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-hung", model, workers=2, extra=["--dead-ms", "1000"]) as g:
        pid = role_pid(g, "worker-0")
        sibling = role_pid(g, "worker-1")
        bg = G.Background(g, PROMPT, N)
        bg.wait_started()
        os.kill(pid, signal.SIGSTOP)
        G.log("  stopped worker-0 (pid %d) mid-request" % pid)
        try:
            G.check_eq(bg.result(), want, "token ids of the request whose worker hung")
            wait_back(g, "worker-0", pid)
            G.check("no heartbeat" in g.log("coordinator"), "coordinator.log does not say 'no heartbeat'")
            st = g.status()
            G.check(st["worker-1"]["restarts"] == 0 and st["worker-1"]["pid"] == sibling,
                    "worker-1, which was not stopped, was replaced: %s", st["worker-1"]["line"])
        finally:
            if G.pid_alive(pid):
                os.kill(pid, signal.SIGCONT)


@t.case
def test_supervision_worker_sigstop_spares_sibling():
    # SIGSTOP worker-0 for 3 s under the default --dead-ms (3000). worker-1 spends those seconds
    # waiting for it at the step barrier; before heartbeats came from a thread of their own it
    # sent none while it waited, and was declared dead in the same millisecond as worker-0.
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-sibling", model, workers=2) as g:
        pid = role_pid(g, "worker-0")
        sibling = role_pid(g, "worker-1")
        bg = G.Background(g, PROMPT, N)
        bg.wait_started()
        os.kill(pid, signal.SIGSTOP)
        G.log("  stopped worker-0 (pid %d) mid-request for 3 s" % pid)
        try:
            time.sleep(3.0)
        finally:
            if G.pid_alive(pid):
                os.kill(pid, signal.SIGCONT)
        G.check_eq(bg.result(), want, "token ids of the request whose worker was stopped for 3 s")
        clog = g.log("coordinator")
        lost = [line for line in clog.splitlines() if " lost: " in line]
        G.log("  losses: %r" % lost)
        G.check(not any("worker-1 " in line for line in lost), "worker-1, never stopped, was declared "
                "lost:\n%s", "\n".join(lost))
        st = g.status()
        G.check(st["worker-1"]["pid"] == sibling and st["worker-1"]["restarts"] == 0,
                "worker-1 was replaced: %s", st["worker-1"]["line"])
        G.check(G.pid_alive(sibling), "worker-1 (pid %d) is gone", sibling)
        G.check_eq(g.ids(PROMPT, 48), want[:48], "a request after the stop")


@t.case
def test_supervision_speculator_sigkill_mid_request():
    model = slow_model()
    want = want_ids(model)
    # every step waits for the drafts (--draft-wait fixed): on a loaded machine (the sanitizer
    # build) a measured wait can rightly skip a restarted drafter, which is not what is tested here
    with G.Group("sup-spec", model, workers=2, speculators=["ngram", "layerskip:layers=0-3"],
                 extra=["--draft-wait", "fixed", "--draft-wait-ms", "2000"]) as g:
        pid = kill_mid_request(g, "layerskip-1", want)
        wait_back(g, "layerskip-1", pid)
        r = g.complete(PROMPT, 64)
        G.check_eq(r["orochi"]["token_ids"], want[:64], "a request after the speculator restart")
        G.check(r["orochi"]["draft_kinds"], "no drafts used after the restart: %r", r["orochi"])


@t.case
def test_supervision_speculator_long_prompt_not_restarted():
    # a reset Feedback with a ~1000-token prompt keeps a layerskip speculator (all 30 layers, one
    # thread) in its prefill for seconds, far longer than --dead-ms 1000; it heartbeats from a
    # thread of its own meanwhile, so it is never declared dead and drafts for the request
    model = G.default_model()
    if not model:
        raise G.Skip("the default model is absent (make models)")
    prompt = " ".join("Sentence number %d says that the weather is nice today." % i for i in range(80))
    with G.Group("sup-longprompt", model, workers=2, speculators=["layerskip:layers=0-29"],
                 extra=["--dead-ms", "1000"]) as g:
        spid = role_pid(g, "layerskip")
        t0 = time.time()
        r = g.complete(prompt, 24, timeout=300)
        G.log("  %d prompt tokens, %d generated in %.1f s, drafts from %r" % (
            r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"], time.time() - t0,
            r["orochi"]["draft_kinds"]))
        G.check(r["usage"]["prompt_tokens"] >= 1000, "the prompt is only %d tokens", r["usage"]["prompt_tokens"])
        time.sleep(1.5)  # longer than --dead-ms: a late verdict would show now
        lost = [line for line in g.log("coordinator").splitlines() if " lost: " in line]
        G.check(not lost, "peers were declared lost during a long prompt:\n%s", "\n".join(lost))
        st = g.status()
        G.check(st["layerskip"]["pid"] == spid and st["layerskip"]["restarts"] == 0,
                "the speculator was restarted: %s", st["layerskip"]["line"])
        if G.asan_build():  # its prefill takes longer than the request there: alive is the point
            G.log("  an ASan build: drafts not required (%s)" % st["layerskip"]["line"])
        else:
            G.check(st["layerskip"]["steps"] and st["layerskip"]["steps"] > 0, "the speculator "
                    "published no draft: %s", st["layerskip"]["line"])


@t.case
def test_supervision_both_speculators_and_a_worker():
    # everything but the coordinator dies during one request
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-all", model, workers=2, speculators=["ngram", "layerskip:layers=0-1"]) as g:
        st = g.status()
        pids = {r: st[r]["pid"] for r in ("ngram", "layerskip-1", "worker-0")}
        bg = G.Background(g, PROMPT, N)
        bg.wait_started()
        for r, p in pids.items():
            os.kill(p, signal.SIGKILL)
        G.log("  killed %s mid-request" % pids)
        G.check_eq(bg.result(), want, "token ids of the request that lost three roles")
        for r, p in pids.items():
            wait_back(g, r, p)


@t.case
def test_supervision_attach_speculator_mid_request():
    # one single-threaded worker and a long answer: the request runs for a few seconds, long
    # enough for the speculator to start and join while it is being generated (the slow model's
    # layers with a context of 2048: 460 tokens took half a second on a fast machine)
    model = G.mkmodel(layers=8, dim=512, ffn=1024, heads=8, kv_heads=2, vocab=300, ctx=2048, type="f32",
                      seed=7)
    n_long = 1800
    want_long = G.run_ids(model, PROMPT, n_long)
    want = want_long[:N]
    G.check(len(want_long) == n_long, "the reference stops after %d tokens", len(want_long))
    # --draft-wait fixed: every step waits for the attached speculator's draft, so whether it is
    # used does not hang on its measured reply time on a loaded machine (ctest -j 2);
    # --lookup-run off: the attached process itself drafts (through the verification cycles)
    # instead of the workers' prompt lookup standing in for it
    with G.Group("sup-attach", model, workers=1,
                 extra=["--draft-wait", "fixed", "--lookup-run", "off"]) as g:
        bg = G.Background(g, PROMPT, n_long)
        bg.wait_started()
        r = g.launch("attach-speculator", "--kind", "ngram", "--id", "live-ngram", timeout=60, check=False)
        G.check(r.returncode == 0, "attach-speculator failed (%d): %s%s", r.returncode, r.stdout, r.stderr)
        G.check("attached" in r.stdout, "attach-speculator printed %r", r.stdout)
        running = not bg.finished.is_set()
        G.log("  %s (request still running: %s)" % (r.stdout.strip(), running))
        G.check(running, "the request finished before the speculator had joined: the test proves nothing")
        G.check_eq(bg.result(), want_long, "token ids of the request during which a speculator attached")
        G.check(bg.orochi["draft_kinds"] == ["ngram"], "the speculator that joined mid-request drafted "
                "nothing for it: draft_kinds %r", bg.orochi["draft_kinds"])
        st = g.status()
        G.check("live-ngram" in st and st["live-ngram"]["connected"] and st["live-ngram"]["kind"] == "ngram",
                "the attached speculator is not in status: %r", {k: v["line"] for k, v in st.items()})
        s = g.launch("status").stdout
        G.check(any(line.split()[:1] == ["live-ngram"] for line in s.splitlines()),
                "orochi-launch status does not list live-ngram:\n%s", s)
        # the next request drafts with it (the output repeats itself: prompt lookup finds it)
        r = g.complete(PROMPT, 64)
        G.check_eq(r["orochi"]["token_ids"], want[:64], "a request with the attached speculator")
        G.check(r["orochi"]["draft_kinds"] == ["ngram"], "draft_kinds %r, expected ['ngram']",
                r["orochi"]["draft_kinds"])
        G.check(r["orochi"]["mean_accepted"] > 1, "mean_accepted %r with a repetitive output",
                r["orochi"]["mean_accepted"])


def arena_path(g):
    m = re.search(r"arena (/orochi-[0-9a-f]+)", g.log("coordinator"))
    return "/dev/shm" + m.group(1) if m else None


def supervisor_pid(g):
    with open(g.path("supervisor.pid")) as f:
        return int(f.read().strip())


class RequestLoop:
    """Back-to-back completions in a thread; each outcome is recorded with its send time."""

    def __init__(self, g, prompt, n):
        self.results = []  # (sent, finished, ids or None, what)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(g, prompt, n), daemon=True)
        self.thread.start()

    def _run(self, g, prompt, n):
        while not self.stop.is_set():
            sent = time.time()
            try:
                r = G.http(g.url + "/v1/completions", "POST",
                           {"prompt": prompt, "max_tokens": n, "temperature": 0}, timeout=20)
                ok = r.status == 200 and isinstance(r.json, dict)
                self.results.append((sent, time.time(), r.json["orochi"]["token_ids"] if ok else None,
                                     "HTTP %d" % r.status))
            except Exception as e:  # noqa: BLE001 - connection refused/reset while it restarts
                self.results.append((sent, time.time(), None, repr(e)[:120]))
                time.sleep(0.05)

    def finish(self):
        self.stop.set()
        self.thread.join(60)
        return self.results


@t.case
def test_supervision_coordinator_sigkill_restarted_by_supervisor():
    # kill -9 the coordinator while requests keep coming: the launcher's supervisor starts a new
    # coordinator (and a new set of workers and speculators) and requests sent after the kill
    # succeed again within 5 s, with the same tokens; the old peers are gone, the old arena too
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)
    prompt = "coordinator crash"
    want = G.run_ids(model, prompt, 24)
    g = G.Group("sup-coord-restart", model, workers=2, speculators=["ngram"])
    with g:
        sup = supervisor_pid(g)
        cpid = g.coordinator_pid()
        old_peers = {r: v["pid"] for r, v in g.status().items() if r != "coordinator"}
        old_arena = os.stat(arena_path(g)).st_ino
        loop = RequestLoop(g, prompt, 24)
        time.sleep(1.0)
        killed = time.time()
        os.kill(cpid, signal.SIGKILL)
        G.log("  killed the coordinator (pid %d) under a request loop" % cpid)
        deadline = time.time() + 20
        while time.time() < deadline and not any(r[0] > killed and r[2] for r in loop.results):
            time.sleep(0.1)
        time.sleep(1.0)  # a few more requests after the recovery
        results = loop.finish()
        before = [r for r in results if r[1] < killed]
        after = [r for r in results if r[0] > killed]
        G.check(before and all(r[2] == want for r in before), "requests before the kill: %r",
                [r[3] for r in before if r[2] != want][:5])
        first_ok = next((r for r in after if r[2]), None)
        G.check(first_ok is not None, "no request succeeded after the kill: %r", [r[3] for r in after][-5:])
        G.log("  %d requests failed after the kill; the first sent after it to succeed finished %.2f s "
              "after the kill" % (sum(1 for r in after if not r[2]), first_ok[1] - killed))
        G.check(first_ok[1] - killed <= 5.0, "the group served again only %.2f s after the kill",
                first_ok[1] - killed)
        G.check(all(r[2] == want for r in after if r[2]), "a request after the restart gave other tokens")
        recovered = [r for r in after if r[0] > first_ok[1]]
        G.check(recovered and all(r[2] == want for r in recovered), "requests after the recovery failed: %r",
                [r[3] for r in recovered if r[2] != want][:5])
        new = g.coordinator_pid()
        G.check(new != cpid and G.pid_alive(new), "coordinator pid %d -> %d", cpid, new)
        G.check(supervisor_pid(g) == sup and G.pid_alive(sup), "the supervisor changed or died")
        G.check(not [p for p in old_peers.values() if G.pid_alive(p)], "peers of the killed coordinator "
                "are still running: %r", {r: p for r, p in old_peers.items() if G.pid_alive(p)})
        G.check(os.stat(arena_path(g)).st_ino != old_arena, "the arena was not created anew")
        slog = g.log("supervisor")
        G.check("killed by signal 9" in slog and "restart 1 of" in slog, "supervisor.log says:\n%s", slog)
        out = g.launch("status").stdout
        G.check(re.search(r"^supervisor\s+pid %d\s+restarts 1" % sup, out, re.M),
                "status does not show the supervisor with restarts 1:\n%s", out)
        arena = arena_path(g)
        pids = [v["pid"] for v in g.status().values() if v["pid"]]
    deadline = time.time() + 10
    while time.time() < deadline and any(G.pid_alive(p) for p in pids + [sup]):
        time.sleep(0.1)
    G.check(not [p for p in pids + [sup] if G.pid_alive(p)], "processes left after down")
    G.check(not os.path.exists(arena), "%s is left after down", arena)


@t.case
def test_supervision_sigterm_drains():
    # SIGTERM to the coordinator drains: the request under way finishes with all its tokens, a new
    # one is answered 503 and /health says so; then the coordinator exits and (not being stopped by
    # `down`) is started again by the supervisor
    model = slow_model()
    want = G.run_ids(model, PROMPT, 400)
    with G.Group("sup-drain", model, workers=2) as g:
        cpid = g.coordinator_pid()
        bg = G.Background(g, PROMPT, 400)
        bg.wait_started()
        os.kill(cpid, signal.SIGTERM)
        G.log("  SIGTERM to the coordinator (pid %d) mid-request" % cpid)
        g.wait_log("coordinator", "draining", 10)
        r = g.http("/v1/completions", "POST", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}, timeout=30)
        G.check(r.status == 503 and "draining" in r.error_message(), "a request during the drain: %r", r)
        G.check(r.headers.get("Retry-After") == "1", "a 503 during the drain without Retry-After: %r",
                r.headers)
        h = g.http("/health", timeout=10)
        G.check(h.status == 503 and "draining" in h.body.decode(), "/health during the drain: %r", h)
        G.check(not bg.finished.is_set(), "the request finished before the drain was checked")
        G.check_eq(bg.result(), want, "token ids of the request that was under way at SIGTERM")
        g.wait_log("coordinator", "drained", 30)
        deadline = time.time() + 30
        new = cpid
        while time.time() < deadline:
            try:
                new = g.coordinator_pid()
            except (OSError, ValueError):
                pass
            if new != cpid and g.healthy():
                break
            time.sleep(0.1)
        G.check(new != cpid and not G.pid_alive(cpid), "the coordinator was not started again (%d -> %d)", cpid, new)
        G.check_eq(g.ids(PROMPT, 24), want[:24], "a request after the drain and restart")


@t.case
def test_supervision_crash_loop_gives_up():
    # a coordinator that keeps dying is restarted --max-restarts times, backing off, then the
    # supervisor gives up with a message that says so, and nothing of the group is left
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)

    class Limited(G.Group):
        def up_args(self):
            args = super().up_args()
            return args[:1] + ["--max-restarts", "2"] + args[1:]

    g = Limited("sup-crashloop", model, workers=1)
    with g:
        sup = supervisor_pid(g)
        arena = arena_path(g)
        seen = set()
        for i in range(3):
            deadline = time.time() + 30
            cpid = None
            while time.time() < deadline:
                try:
                    cpid = g.coordinator_pid()
                except (OSError, ValueError):
                    cpid = None
                if cpid and cpid not in seen and G.pid_alive(cpid):
                    break
                time.sleep(0.05)
            G.check(cpid and cpid not in seen, "no new coordinator to kill (round %d)", i + 1)
            seen.add(cpid)
            os.kill(cpid, signal.SIGKILL)
            G.log("  killed coordinator %d (round %d)" % (cpid, i + 1))
        deadline = time.time() + 30
        while time.time() < deadline and G.pid_alive(sup):
            time.sleep(0.1)
        G.check(not G.pid_alive(sup), "the supervisor did not give up:\n%s", g.log("supervisor"))
        slog = g.log("supervisor")
        G.log("  supervisor.log ends with: %s" % slog.strip().splitlines()[-1])
        G.check("giving up after 2 restarts" in slog, "supervisor.log does not say it gave up:\n%s", slog)
        G.check("restart 2 of 2 in 1s" in slog, "no back-off in supervisor.log:\n%s", slog)
        r = g.launch("status", check=False)
        G.check(r.returncode != 0 and "supervisor gave up" in r.stdout, "status after giving up: rc %d %r",
                r.returncode, r.stdout)
        G.check(not os.path.exists(arena), "%s is left after the supervisor gave up", arena)
        left = subprocess.run(["pgrep", "-f", g.run_dir], capture_output=True, text=True).stdout.split()
        G.check(not left, "processes of the group left after the supervisor gave up: %r", left)


@t.case
def test_supervision_coordinator_sigkill_orphans_exit_then_up_again():
    # with the supervisor gone too, a crashed coordinator still leaves nothing behind: workers and
    # speculators give up after their --orphan-ms (10 s by default) and the last one out removes
    # the arena from /dev/shm (the coordinator cannot); a new group starts in the same run directory
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)
    prompt = "coordinator crash"
    want = G.run_ids(model, prompt, 24)
    g = G.Group("sup-coord", model, workers=2, speculators=["ngram", "layerskip:layers=0"])
    with g:
        st = g.status()
        cpid = g.coordinator_pid()
        peers = {r: v["pid"] for r, v in st.items() if r != "coordinator"}
        arena = arena_path(g)
        G.check(arena and os.path.exists(arena), "no arena %r in /dev/shm", arena)
        os.kill(supervisor_pid(g), signal.SIGKILL)
        os.kill(cpid, signal.SIGKILL)
        G.log("  killed the supervisor and the coordinator (pid %d); waiting for %s to exit" % (cpid, sorted(peers)))
        deadline = time.time() + 25
        while time.time() < deadline and any(G.pid_alive(p) for p in peers.values()):
            time.sleep(0.2)
        left = {r: p for r, p in peers.items() if G.pid_alive(p)}
        G.check(not left, "still running 25 s after the coordinator died: %r", left)
        for r in peers:
            G.check("exiting" in g.log(r), "%s.log does not say why it exited:\n%s", r, g.log(r)[-800:])
        G.check(not os.path.exists(arena), "%s is left in /dev/shm after the group's processes exited", arena)
        G.check(any("removed the arena" in g.log(r) for r in peers), "no peer says it removed the arena")
        # up again in the same run directory
        g.down()
        g.up()
        G.check(g.coordinator_pid() != cpid, "the old coordinator pid is back")
        G.check_eq(g.ids(prompt, 24), want, "completion from the group started after the crash")


if __name__ == "__main__":
    t.main()
