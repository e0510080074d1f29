"""Supervision: killing a role mid-request loses nothing.

The KV cache and the step inputs live in the arena, so when a worker dies during a request the
coordinator spawns it again and re-runs the interrupted step: the request must complete with
exactly the tokens of an undisturbed run, and the status file must show the worker back with
`restarts 1`. A dead speculator only means fewer drafts (the request completes identically, the
speculator is restarted); a hung worker (SIGSTOP) is declared dead after --dead-ms and replaced; a
speculator attached while a request runs joins the group and drafts for the next request; when
the coordinator itself is killed, every other role exits on its own and a new group starts in the
same run directory.

The model is large enough (8 layers, dim 512) that a 200-token request takes a second or more on
two cores, so the kill lands while the request is being generated: the test waits for the first
streamed chunk before it kills.
"""
import os
import re
import signal
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


class Background:
    """A streamed completion in a thread: .started is set at the first content chunk."""

    def __init__(self, g, prompt, n):
        self.started = threading.Event()
        self.finished = threading.Event()
        self.events, self.done, self.error = [], False, None
        self.thread = threading.Thread(target=self._run, args=(g, prompt, n), daemon=True)
        self.thread.start()

    def _run(self, g, prompt, n):
        def on_event(ev):
            if ev.get("choices") and ev["choices"][0].get("text"):
                self.started.set()
        try:
            self.events, self.done = G.sse_events(g.url + "/v1/completions",
                                                  {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                   "stream": True}, timeout=300, on_event=on_event)
        except Exception as e:  # noqa: BLE001 - reported by result()
            self.error = e
        finally:
            self.started.set()
            self.finished.set()

    def wait_started(self, timeout=60):
        G.check(self.started.wait(timeout), "the request produced nothing in %ds", timeout)
        G.check(not self.finished.is_set(), "the request finished before anything could be killed "
                "(the model is too fast for this test): %r", self.error or self.events[-1:])

    def result(self, timeout=240):
        G.check(self.finished.wait(timeout), "the request did not finish in %ds", timeout)
        if self.error:
            raise AssertionError("the streamed request failed: %r" % (self.error,))
        G.check(self.done, "the stream ended without [DONE]")
        last = self.events[-1] if self.events else {}
        G.check("error" not in last, "the stream ended with an error: %r", last)
        G.check("orochi" in last, "the final chunk has no orochi object: %r", last)
        self.orochi = last["orochi"]
        return last["orochi"]["token_ids"]


def role_pid(g, role):
    st = g.wait_status(lambda s: s.get(role, {}).get("connected"), 30, "%s connected" % role)
    return st[role]["pid"]


def wait_back(g, role, old_pid, restarts=1, timeout=60):
    st = g.wait_status(lambda s: s.get(role, {}).get("connected") and s[role]["pid"] != old_pid
                       and s[role]["restarts"] == restarts, timeout,
                       "%s back with a new pid and restarts %d" % (role, restarts))
    G.log("  status: %s" % st[role]["line"].strip())
    return st[role]["pid"]


@t.case
def test_supervision_worker_sigkill_mid_request():
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-worker", model, workers=2) as g:
        t0 = time.time()
        G.check_eq(g.ids(PROMPT, N), want, "undisturbed group run")
        G.log("  undisturbed request: %.2fs" % (time.time() - t0))
        pid = role_pid(g, "worker-1")
        bg = Background(g, PROMPT, N)
        bg.wait_started()
        os.kill(pid, signal.SIGKILL)
        G.log("  killed worker-1 (pid %d) mid-request" % pid)
        G.check_eq(bg.result(), want, "token ids of the request that lost a worker")
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
def test_supervision_worker_sigstop_declared_dead():
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-hung", model, workers=2, extra=["--dead-ms", "1000"]) as g:
        pid = role_pid(g, "worker-0")
        bg = Background(g, PROMPT, N)
        bg.wait_started()
        os.kill(pid, signal.SIGSTOP)
        G.log("  stopped worker-0 (pid %d) mid-request" % pid)
        try:
            G.check_eq(bg.result(), want, "token ids of the request whose worker hung")
            wait_back(g, "worker-0", pid)
            G.check("no heartbeat" in g.log("coordinator"), "coordinator.log does not say 'no heartbeat'")
        finally:
            if G.pid_alive(pid):
                os.kill(pid, signal.SIGCONT)


@t.case
def test_supervision_speculator_sigkill_mid_request():
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-spec", model, workers=2, speculators=["ngram", "layerskip:layers=0-3"]) as g:
        pid = role_pid(g, "layerskip-1")
        bg = Background(g, PROMPT, N)
        bg.wait_started()
        os.kill(pid, signal.SIGKILL)
        G.log("  killed layerskip-1 (pid %d) mid-request" % pid)
        G.check_eq(bg.result(), want, "token ids of the request that lost a speculator")
        wait_back(g, "layerskip-1", pid)
        r = g.complete(PROMPT, 64)
        G.check_eq(r["orochi"]["token_ids"], want[:64], "a request after the speculator restart")
        G.check(r["orochi"]["draft_kinds"], "no drafts used after the restart: %r", r["orochi"])


@t.case
def test_supervision_both_speculators_and_a_worker():
    # everything but the coordinator dies during one request
    model = slow_model()
    want = want_ids(model)
    with G.Group("sup-all", model, workers=2, speculators=["ngram", "layerskip:layers=0-1"]) as g:
        st = g.status()
        pids = {r: st[r]["pid"] for r in ("ngram", "layerskip-1", "worker-0")}
        bg = Background(g, PROMPT, N)
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
    # enough for the speculator to start and join while it is being generated
    model = slow_model()
    n_long = 460
    want_long = G.run_ids(model, PROMPT, n_long)
    want = want_long[:N]
    G.check(len(want_long) == n_long, "the reference stops after %d tokens", len(want_long))
    with G.Group("sup-attach", model, workers=1) as g:
        bg = Background(g, PROMPT, n_long)
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


@t.case
def test_supervision_coordinator_sigkill_orphans_exit_then_up_again():
    # a crashed coordinator leaves no process behind (workers and speculators give up after their
    # --orphan-ms, 10 s by default), and a new group starts in the same run directory over the
    # stale socket and arena
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)
    prompt = "coordinator crash"
    want = G.run_ids(model, prompt, 24)
    g = G.Group("sup-coord", model, workers=2, speculators=["ngram", "layerskip:layers=0"])
    with g:
        st = g.status()
        cpid = g.coordinator_pid()
        peers = {r: v["pid"] for r, v in st.items() if r != "coordinator"}
        os.kill(cpid, signal.SIGKILL)
        G.log("  killed the coordinator (pid %d); waiting for %s to exit" % (cpid, sorted(peers)))
        deadline = time.time() + 25
        while time.time() < deadline and any(G.pid_alive(p) for p in peers.values()):
            time.sleep(0.2)
        left = {r: p for r, p in peers.items() if G.pid_alive(p)}
        G.check(not left, "still running 25 s after the coordinator died: %r", left)
        for r in peers:
            G.check("exiting" in g.log(r), "%s.log does not say why it exited:\n%s", r, g.log(r)[-800:])
        m = re.search(r"arena (/orochi-[0-9a-f]+)", g.log("coordinator"))
        arena = "/dev/shm" + m.group(1) if m else None
        G.check(arena and os.path.exists(arena), "no arena %r to be left behind", arena)
        # `down` removes the arena the dead coordinator could not unlink
        g.down()
        G.check(not os.path.exists(arena), "%s is left after down", arena)
        # up again in the same run directory
        g.up()
        G.check(g.coordinator_pid() != cpid, "the old coordinator pid is back")
        G.check_eq(g.ids(prompt, 24), want, "completion from the group started after the crash")


if __name__ == "__main__":
    t.main()
