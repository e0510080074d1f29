"""deploy/orochi-launch: status, logs, restart, attach, debug and down on a real group.

- `status` prints one line per process, the role's name first (coordinator, workers, speculators);
- `logs worker-0` prints the worker's log; an unknown role is an error naming the known ones;
- `restart worker-1` stops it and the coordinator brings it back (a new pid, connected, restarts 1);
  `restart` of an attached speculator starts it again; `restart coordinator` restarts the group;
- `up` in a run directory with a running group is refused;
- `debug worker-0` starts everything but worker-0 and runs worker-0 in the foreground: the group
  becomes healthy and serves a request identical to `orochi run`; `debug` of an unknown role is
  refused before the running group is stopped;
- `status` counts the steps each worker has computed while a long request is still running (the
  workers heartbeat their count from a thread of their own, not only when idle);
- `status` shows the supervisor `up` starts; `down` stops it too and leaves no process and no
  shared-memory arena behind.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROMPT = "launcher test prompt"
N = 24


def tiny():
    return G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=31)


def arena_name(g):
    m = re.search(r"arena (/orochi-[0-9a-f]+)", g.log("coordinator"))
    return m.group(1) if m else None


@t.case
def test_launch_status_logs_restart_down():
    model = tiny()
    want = G.run_ids(model, PROMPT, N)
    g = G.Group("launch", model, workers=2, speculators=["ngram"])
    with g:
        out = g.launch("status").stdout
        G.log("  status:\n" + "\n".join("    " + line for line in out.splitlines()))
        # one line per process, "ROLE pid PID ..."; other lines (e.g. the controllers' state) name
        # no process and carry no pid
        lines = [line for line in out.splitlines() if len(line.split()) > 2 and line.split()[1] == "pid"]
        roles = [line.split()[0] for line in lines]
        G.check(sorted(roles) == sorted(["coordinator", "worker-0", "worker-1", "ngram", "supervisor"]),
                "status lists the processes %r", roles)
        G.check(len(set(roles)) == len(roles), "a role is listed twice: %r", roles)
        G.check(out.splitlines()[0].split()[0] == "coordinator", "the first line is not the coordinator: %r",
                out.splitlines()[0])
        for line in lines:
            G.check(re.match(r"^\S+\s+pid \d+ ", line), "a process line without 'ROLE pid PID': %r", line)

        log = g.launch("logs", "worker-0").stdout
        G.check("worker-0" in log and "joined" in log, "logs worker-0 printed:\n%s", log[-1000:])
        G.check(log == g.log("worker-0"), "logs worker-0 is not the log file")
        r = g.launch("logs", "no-such-role", check=False)
        G.check(r.returncode != 0 and "no-such-role" in r.stderr, "logs of an unknown role: rc %d %r",
                r.returncode, r.stderr)

        r = g.launch("up", "--target", model, "--port", str(G.free_port()), check=False)
        G.check(r.returncode != 0 and "already running" in r.stderr, "a second up in the same run dir: "
                "rc %d %r", r.returncode, r.stderr)

        old = g.status()["worker-1"]["pid"]
        r = g.launch("restart", "worker-1")
        G.check("restarting" in r.stdout, "restart printed %r", r.stdout)
        st = g.wait_status(lambda s: s["worker-1"]["connected"] and s["worker-1"]["pid"] != old
                           and s["worker-1"]["restarts"] == 1, 30, "worker-1 back after restart")
        G.log("  after restart: %s" % st["worker-1"]["line"].strip())
        G.check(not G.pid_alive(old), "the old worker-1 (pid %d) is still alive", old)
        G.check(st["worker-0"]["restarts"] == 0, "worker-0 was restarted too")
        G.check_eq(g.ids(PROMPT, N), want, "completion after restarting worker-1")
        r = g.launch("restart", "no-such-role", check=False)
        G.check(r.returncode != 0, "restart of an unknown role succeeded")

        # an attached speculator is restarted by the launcher itself
        r = g.launch("attach-speculator", "--kind", "ngram", "--id", "att", timeout=60)
        old_att = g.wait_status(lambda s: s.get("att", {}).get("connected"), 20, "att connected")["att"]["pid"]
        g.launch("restart", "att")
        st = g.wait_status(lambda s: s.get("att", {}).get("connected") and s["att"]["pid"] != old_att, 30,
                           "att back with a new pid")
        G.log("  attached speculator after restart: %s" % st["att"]["line"].strip())
        G.check(not G.pid_alive(old_att), "the old attached speculator (pid %d) is still alive", old_att)

        # keep what down must clean up
        pids = [v["pid"] for v in g.status().values() if v["pid"]]
        with open(g.path("supervisor.pid")) as f:
            pids.append(int(f.read()))
        arena = arena_name(g)
        G.check(arena and os.path.exists("/dev/shm" + arena), "arena %r not found in /dev/shm", arena)
    # the with-block ran `down`
    deadline = time.time() + 10
    while time.time() < deadline and any(G.pid_alive(p) for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if G.pid_alive(p)]
    G.check(not alive, "processes left after down: %r", alive)
    G.check(not os.path.exists("/dev/shm" + arena), "the arena %s is left after down", arena)
    r = g.launch("status", check=False)
    G.check(r.returncode != 0 and "not running" in r.stdout, "status after down: rc %d %r", r.returncode, r.stdout)


def slow_model():
    return G.mkmodel(layers=12, dim=512, ffn=1024, heads=8, kv_heads=2, vocab=300, ctx=512, type="f32", seed=7)


@t.case
def test_launch_status_counts_worker_steps_under_load():
    # the steps column of a worker is the count its heartbeats carry; it must follow the work
    # while the worker is busy, not only once the group is idle again (a worker used to heartbeat
    # only from its idle loop: under load `status` showed 0 steps for it)
    model = slow_model()
    with G.Group("launch-steps", model, workers=2) as g:
        done = threading.Event()

        def run():
            try:
                g.complete("status steps under load", 480, timeout=300)  # ~4 s, no eos before 480
            finally:
                done.set()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        out = None
        deadline = time.time() + 120
        while time.time() < deadline and not done.is_set():
            if (g.status().get("coordinator", {}).get("steps") or 0) >= 150:
                out = g.launch("status").stdout
                break
            time.sleep(0.05)
        busy = not done.is_set()
        G.check(out is not None, "the request ended before 150 steps had run: the test proves nothing")
        seen = G.parse_status(out.splitlines())
        coord = seen["coordinator"]["steps"]
        G.log("  mid-request (still running: %s): coordinator %d steps, workers %s" % (
            busy, coord, [seen[w]["steps"] for w in ("worker-0", "worker-1")]))
        G.check(busy, "the request finished while the status was read")
        for w in ("worker-0", "worker-1"):
            # heartbeats (every 200 ms) and the status file lag the coordinator's own count by
            # up to a second or two of steps on a loaded machine; what matters is that the count
            # follows the work at all (it used to read 0 until the group was idle)
            G.check(seen[w]["steps"] is not None and seen[w]["steps"] >= coord // 4,
                    "%s shows %s steps while the coordinator has run %d:\n%s", w, seen[w]["steps"], coord,
                    out)
        th.join(300)
        # at rest, every step the coordinator ran was computed by each worker
        st = g.wait_status(lambda s: all(s[w]["steps"] == s["coordinator"]["steps"] for w in ("worker-0", "worker-1")),
                           5, "the workers' steps equal to the coordinator's")
        G.log("  at rest: %s" % {r: v["steps"] for r, v in st.items()})


@t.case
def test_launch_restart_coordinator():
    model = tiny()
    want = G.run_ids(model, PROMPT, N)
    with G.Group("launch-coord", model, workers=2) as g:
        old = g.coordinator_pid()
        g.launch("restart", "coordinator", timeout=120)
        new = g.coordinator_pid()
        G.check(new != old and G.pid_alive(new) and not G.pid_alive(old), "coordinator pid %d -> %d", old, new)
        g.wait_healthy(30)
        G.check_eq(g.ids(PROMPT, N), want, "completion after restarting the coordinator")


@t.case
def test_launch_debug_worker():
    model = tiny()
    want = G.run_ids(model, PROMPT, N)
    g = G.Group("launch-debug", model, workers=2, speculators=["ngram"])
    with g:
        old_coord = g.coordinator_pid()
        # an unknown role is refused before anything is stopped
        r = g.launch("debug", "no-such-role", check=False, timeout=30)
        G.check(r.returncode != 0 and "no-such-role" in r.stderr, "debug of an unknown role: rc %d %r",
                r.returncode, r.stderr)
        G.check(g.coordinator_pid() == old_coord and g.healthy(), "debug of an unknown role disturbed the group")
        out_path = g.path("debug-worker-0.out")
        with open(out_path, "w") as out:
            dbg = subprocess.Popen([g.env["launch"], "debug", "worker-0", "--run-dir", g.run_dir],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=g.launch_env(), start_new_session=True)
        try:
            # `debug` takes the group down and starts it again without worker-0
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    if g.coordinator_pid() != old_coord and g.healthy():
                        break
                except (OSError, ValueError):
                    pass
                G.check(dbg.poll() is None, "debug exited with %s:\n%s", dbg.returncode, open(out_path).read())
                time.sleep(0.2)
            else:
                raise AssertionError("the debug group did not become healthy:\n%s" % open(out_path).read())
            st = g.wait_status(lambda s: s.get("worker-0", {}).get("connected") and s.get("worker-1", {}).get("connected"),
                               30, "both workers connected under debug")
            G.check(st["worker-0"]["pid"] == dbg.pid, "worker-0 is pid %s, not the foreground process %d",
                    st["worker-0"]["pid"], dbg.pid)
            G.check_eq(g.ids(PROMPT, N), want, "completion with worker-0 in the foreground")
            text = open(out_path).read()
            G.check("running worker-0 in the foreground" in text, "debug said:\n%s", text)
            G.check("not spawning worker-0" in g.log("coordinator"), "the coordinator spawned worker-0 itself")
            G.log("  debug: worker-0 is the foreground pid %d; request identical" % dbg.pid)
        finally:
            if dbg.poll() is None:
                os.killpg(dbg.pid, signal.SIGTERM)
                try:
                    dbg.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(dbg.pid, signal.SIGKILL)
                    dbg.wait(10)
        G.log("  the foreground worker exited with %s" % dbg.returncode)


if __name__ == "__main__":
    t.main()
